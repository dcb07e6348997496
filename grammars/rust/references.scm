(call_expression function: (identifier) @reference)
(call_expression function: (field_expression field: (field_identifier) @reference))
(call_expression function: (scoped_identifier name: (identifier) @reference))
(field_expression value: (identifier) @reference)
(arguments (identifier) @reference)
(type_identifier) @reference
