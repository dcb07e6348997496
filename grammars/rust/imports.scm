(use_declaration argument: (scoped_identifier path: (_) @module name: (identifier) @name)) @import
(use_declaration argument: (identifier) @module) @import
(use_declaration argument: (use_as_clause path: (scoped_identifier path: (_) @module name: (identifier) @name) alias: (identifier) @alias)) @import
(use_declaration argument: (scoped_use_list path: (_) @module list: (use_list (identifier) @name))) @import
(use_declaration argument: (scoped_use_list path: (_) @module list: (use_list (self) @name))) @import
(use_declaration argument: (use_wildcard (_) @module) @name) @import
(extern_crate_declaration name: (identifier) @module) @import
