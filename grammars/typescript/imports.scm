(import_statement (import_clause (identifier) @name) source: (string (string_fragment) @module)) @import
(import_statement (import_clause (namespace_import (identifier) @alias)) source: (string (string_fragment) @module)) @import
(import_statement (import_clause (named_imports (import_specifier name: (identifier) @name !alias))) source: (string (string_fragment) @module)) @import
(import_statement (import_clause (named_imports (import_specifier name: (identifier) @name alias: (identifier) @alias))) source: (string (string_fragment) @module)) @import
