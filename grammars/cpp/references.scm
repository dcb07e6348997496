(call_expression function: (identifier) @reference)
(call_expression function: (field_expression field: (field_identifier) @reference))
(field_expression argument: (identifier) @reference)
(argument_list (identifier) @reference)
(type_identifier) @reference
