(function_declaration name: (identifier) @name body: (block) @body) @definition.function
(method_declaration receiver: (parameter_list (parameter_declaration type: [(type_identifier) @receiver (pointer_type (type_identifier) @receiver)])) name: (field_identifier) @name body: (block) @body) @definition.method
(type_declaration (type_spec name: (type_identifier) @name type: [(struct_type) (interface_type)] @body)) @definition.class
(type_spec name: (type_identifier) @name type: [(type_identifier) (qualified_type) (function_type) (map_type) (slice_type)]) @definition.type
(field_declaration name: (field_identifier) @name) @definition.field
(method_elem name: (field_identifier) @name) @definition.method
(source_file (const_declaration (const_spec name: (identifier) @name) @definition.variable))
(source_file (var_declaration (var_spec name: (identifier) @name) @definition.variable))
(short_var_declaration left: (expression_list (identifier) @name)) @definition.variable
(parameter_declaration name: (identifier) @name) @definition.parameter
