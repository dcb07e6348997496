[
  (function_item)
  (impl_item)
  (trait_item)
  (struct_item)
  (enum_item)
  (mod_item)
  (closure_expression)
  (if_expression)
  (for_expression)
  (while_expression)
  (loop_expression)
  (match_expression)
] @block
