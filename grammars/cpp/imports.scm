(preproc_include path: [(string_literal (string_content) @module) (system_lib_string) @module]) @import
(using_declaration (qualified_identifier scope: (_) @module name: (identifier) @name)) @import
