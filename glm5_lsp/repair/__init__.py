"""Check every candidate with compilers and repair it before the editor sees it.

- ``diagnostics``: what a checker reports (``Diagnostic``) and the provider interface;
- ``providers/``: compile, tree-sitter, pyflakes, ruff, gcc/g++, node, go vet, and the runner that
  times out, logs and skips a failing provider;
- ``introduced``: a candidate spliced into its document, judged on what it adds;
- ``loop`` + ``repair_prompt``: generate -> splice -> diagnose -> hints and ``error_context`` spans ->
  regenerate, keeping the best candidate;
- ``monitor``: valid names while decoding (a logits processor);
- ``templates``: exception handling filled with the exception types known there;
- ``style``: the file's naming, quote and comment conventions;
- ``perf_hints``: hot-spot rules with suggested rewrites (for the server's hints and code actions);
- ``assemble``: ``standard_loop``, the loop with all of the above attached.

No LSP types here; nothing here writes the user's files.
"""
