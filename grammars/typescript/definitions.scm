(class_declaration name: (type_identifier) @name body: (class_body) @body) @definition.class
(abstract_class_declaration name: (type_identifier) @name body: (class_body) @body) @definition.class
(interface_declaration name: (type_identifier) @name body: (interface_body) @body) @definition.class
(enum_declaration name: (identifier) @name body: (enum_body) @body) @definition.class
(type_alias_declaration name: (type_identifier) @name) @definition.type
(function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(function_signature name: (identifier) @name) @definition.function
(generator_function_declaration name: (identifier) @name body: (statement_block) @body) @definition.function
(method_definition name: (property_identifier) @name body: (statement_block) @body) @definition.method
(method_signature name: (property_identifier) @name) @definition.method
(abstract_method_signature name: (property_identifier) @name) @definition.method
(property_signature name: (property_identifier) @name) @definition.field
(public_field_definition name: (property_identifier) @name) @definition.field
(variable_declarator name: (identifier) @name value: [(arrow_function body: (_) @body) (function_expression body: (_) @body)]) @definition.function
(variable_declarator name: (identifier) @name) @definition.variable
(required_parameter pattern: (identifier) @name) @definition.parameter
(optional_parameter pattern: (identifier) @name) @definition.parameter
(arrow_function parameter: (identifier) @name @definition.parameter)
