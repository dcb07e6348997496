(class_definition name: (identifier) @name body: (block) @body) @definition.class
(function_definition name: (identifier) @name body: (block) @body) @definition.function
(module (expression_statement (assignment left: (identifier) @name) @definition.variable))
(block (expression_statement (assignment left: (identifier) @name) @definition.variable))
(module (expression_statement (assignment left: (pattern_list (identifier) @name)) @definition.variable))
(block (expression_statement (assignment left: (pattern_list (identifier) @name)) @definition.variable))
(for_statement left: (identifier) @name) @definition.variable
(for_statement left: (pattern_list (identifier) @name)) @definition.variable
(with_item value: (as_pattern alias: (as_pattern_target (identifier) @name))) @definition.variable
(except_clause (as_pattern alias: (as_pattern_target (identifier) @name))) @definition.variable
(parameters (identifier) @name @definition.parameter)
(parameters (typed_parameter (identifier) @name) @definition.parameter)
(parameters (default_parameter name: (identifier) @name) @definition.parameter)
(parameters (typed_default_parameter name: (identifier) @name) @definition.parameter)
(parameters (list_splat_pattern (identifier) @name) @definition.parameter)
(parameters (dictionary_splat_pattern (identifier) @name) @definition.parameter)
(parameters (typed_parameter (list_splat_pattern (identifier) @name)) @definition.parameter)
(parameters (typed_parameter (dictionary_splat_pattern (identifier) @name)) @definition.parameter)
(lambda_parameters (identifier) @name @definition.parameter)
(assignment left: (attribute object: (identifier) @_self attribute: (identifier) @name) (#eq? @_self "self")) @definition.field
