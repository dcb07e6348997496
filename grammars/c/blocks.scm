[
  (function_definition)
  (struct_specifier)
  (enum_specifier)
  (if_statement)
  (for_statement)
  (while_statement)
  (do_statement)
  (switch_statement)
] @block
