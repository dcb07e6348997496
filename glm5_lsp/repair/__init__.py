"""Regenerate until a candidate is clean: the loop and what steers it.

- ``loop`` + ``repair_prompt``: generate -> splice -> judge (``glm5_lsp.checks``) -> hints and
  ``error_context`` spans -> regenerate, keeping the best candidate;
- ``truncate``: where an unclean candidate may be cut to a clean prefix;
- ``monitor``: valid names while decoding (a logits processor over ``glm5_lsp.pynames``);
- ``exceptions``: exception handling filled with the exception types known there;
- ``style``: the file's naming, quote and comment conventions;
- ``standard``: ``standard_loop``, the loop with all of the above attached.

No LSP types here; nothing here writes the user's files.
"""
