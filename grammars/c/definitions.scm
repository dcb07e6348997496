(function_definition declarator: (function_declarator declarator: (identifier) @name) body: (compound_statement) @body) @definition.function
(function_definition declarator: (pointer_declarator declarator: (function_declarator declarator: (identifier) @name)) body: (compound_statement) @body) @definition.function
(translation_unit (declaration declarator: (function_declarator declarator: (identifier) @name)) @definition.function)
(translation_unit (declaration declarator: (pointer_declarator declarator: (function_declarator declarator: (identifier) @name))) @definition.function)
(struct_specifier name: (type_identifier) @name body: (field_declaration_list) @body) @definition.class
(union_specifier name: (type_identifier) @name body: (field_declaration_list) @body) @definition.class
(enum_specifier name: (type_identifier) @name body: (enumerator_list) @body) @definition.class
(enumerator name: (identifier) @name) @definition.variable
(type_definition declarator: (type_identifier) @name) @definition.type
(field_declaration declarator: (field_identifier) @name) @definition.field
(translation_unit (declaration declarator: (identifier) @name) @definition.variable)
(translation_unit (declaration declarator: (init_declarator declarator: (identifier) @name)) @definition.variable)
(compound_statement (declaration declarator: (init_declarator declarator: (identifier) @name)) @definition.variable)
(compound_statement (declaration declarator: (identifier) @name) @definition.variable)
(preproc_def name: (identifier) @name) @definition.variable
(preproc_function_def name: (identifier) @name) @definition.function
(parameter_declaration declarator: (identifier) @name) @definition.parameter
(parameter_declaration declarator: (pointer_declarator declarator: (identifier) @name)) @definition.parameter
