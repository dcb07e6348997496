(preproc_include path: [(string_literal (string_content) @module) (system_lib_string) @module]) @import
