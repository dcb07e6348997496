(call_expression function: (identifier) @reference)
(call_expression function: (selector_expression field: (field_identifier) @reference))
(selector_expression operand: (identifier) @reference)
(argument_list (identifier) @reference)
(type_identifier) @reference
