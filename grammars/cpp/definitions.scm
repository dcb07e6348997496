(function_definition declarator: (function_declarator declarator: [(identifier) (field_identifier) (destructor_name) (operator_name)] @name) body: (compound_statement) @body) @definition.function
(function_definition declarator: (function_declarator declarator: (qualified_identifier scope: (_) @receiver name: (_) @name)) body: (compound_statement) @body) @definition.method
(function_definition declarator: (pointer_declarator declarator: (function_declarator declarator: (identifier) @name)) body: (compound_statement) @body) @definition.function
(function_definition declarator: (reference_declarator (function_declarator declarator: [(identifier) (field_identifier)] @name)) body: (compound_statement) @body) @definition.function
(field_declaration declarator: (function_declarator declarator: (field_identifier) @name)) @definition.method
(translation_unit (declaration declarator: (function_declarator declarator: (identifier) @name)) @definition.function)
(class_specifier name: (type_identifier) @name body: (field_declaration_list) @body) @definition.class
(struct_specifier name: (type_identifier) @name body: (field_declaration_list) @body) @definition.class
(union_specifier name: (type_identifier) @name body: (field_declaration_list) @body) @definition.class
(enum_specifier name: (type_identifier) @name body: (enumerator_list) @body) @definition.class
(namespace_definition name: (namespace_identifier) @name body: (declaration_list) @body) @definition.module
(enumerator name: (identifier) @name) @definition.variable
(type_definition declarator: (type_identifier) @name) @definition.type
(alias_declaration name: (type_identifier) @name) @definition.type
(field_declaration declarator: (field_identifier) @name) @definition.field
(translation_unit (declaration declarator: (init_declarator declarator: (identifier) @name)) @definition.variable)
(compound_statement (declaration declarator: (init_declarator declarator: (identifier) @name)) @definition.variable)
(preproc_def name: (identifier) @name) @definition.variable
(preproc_function_def name: (identifier) @name) @definition.function
(parameter_declaration declarator: (identifier) @name) @definition.parameter
(parameter_declaration declarator: (reference_declarator (identifier) @name)) @definition.parameter
(parameter_declaration declarator: (pointer_declarator declarator: (identifier) @name)) @definition.parameter
