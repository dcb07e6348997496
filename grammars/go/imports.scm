(import_spec name: (package_identifier) @alias path: (interpreted_string_literal) @module) @import
(import_spec !name path: (interpreted_string_literal) @module) @import
