(struct_item name: (type_identifier) @name) @definition.class
(enum_item name: (type_identifier) @name body: (enum_variant_list) @body) @definition.class
(union_item name: (type_identifier) @name) @definition.class
(trait_item name: (type_identifier) @name body: (declaration_list) @body) @definition.class
(impl_item type: [(type_identifier) @receiver (generic_type type: (type_identifier) @receiver)] body: (declaration_list) @body) @definition.module
(mod_item name: (identifier) @name) @definition.module
(function_item name: (identifier) @name body: (block) @body) @definition.function
(function_signature_item name: (identifier) @name) @definition.function
(type_item name: (type_identifier) @name) @definition.type
(const_item name: (identifier) @name) @definition.variable
(static_item name: (identifier) @name) @definition.variable
(field_declaration name: (field_identifier) @name) @definition.field
(let_declaration pattern: (identifier) @name) @definition.variable
(parameter pattern: (identifier) @name) @definition.parameter
(macro_definition name: (identifier) @name) @definition.function
