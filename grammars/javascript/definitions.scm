(class_declaration name: (identifier) @name body: (class_body) @body) @definition.class
(function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(generator_function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(method_definition name: (property_identifier) @name body: (statement_block) @body) @definition.method
(variable_declarator name: (identifier) @name value: [(arrow_function body: (_) @body) (function_expression body: (_) @body)]) @definition.function
(variable_declarator name: (identifier) @name) @definition.variable
(field_definition property: (property_identifier) @name) @definition.field
(formal_parameters (identifier) @name @definition.parameter)
(formal_parameters (assignment_pattern left: (identifier) @name) @definition.parameter)
(formal_parameters (rest_pattern (identifier) @name) @definition.parameter)
(arrow_function parameter: (identifier) @name @definition.parameter)
