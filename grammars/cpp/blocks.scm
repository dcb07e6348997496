[
  (function_definition)
  (class_specifier)
  (struct_specifier)
  (namespace_definition)
  (lambda_expression)
  (if_statement)
  (for_statement)
  (for_range_loop)
  (while_statement)
  (do_statement)
  (switch_statement)
  (try_statement)
] @block
