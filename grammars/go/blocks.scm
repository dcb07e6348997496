[
  (function_declaration)
  (method_declaration)
  (func_literal)
  (type_declaration)
  (if_statement)
  (for_statement)
  (expression_switch_statement)
  (type_switch_statement)
  (select_statement)
] @block
