"""Check every candidate with compilers and repair it before the editor sees it.

``diagnostics`` (what a checker reports, the provider interface), ``providers/`` (compile,
tree-sitter, pyflakes, ruff, gcc/g++, node, go vet), ``introduced`` (only what a candidate adds
counts), ``loop`` (generate -> splice -> diagnose -> regenerate), ``monitor`` (valid names while
decoding), ``templates`` (exception handling filled from known exception types), ``style`` (the
file's conventions), ``perf_hints`` (hot-spot rules with rewrites). No LSP types here.
"""
