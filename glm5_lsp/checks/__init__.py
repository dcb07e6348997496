"""Everything that judges code: the checkers and what a candidate is judged on.

- ``providers/``: one module per tool (``compile``, ``tree_sitter``, ``pyflakes``, ``ruff``,
  ``ruff_server``, ``gcc``, ``node``, ``go_vet``) and the ``runner`` that times out, logs, skips a
  failing provider and remembers its last reports;
- ``introduced``: a candidate spliced into its document, judged on what it adds (``judge``);
- ``edits``: an edit the editor is about to apply, judged the same way;
- ``perf_hints``: hot-spot rules with suggested rewrites (the server's hints).

The vocabulary (``Diagnostic``, ``DiagnosticProvider``) is the ground floor's ``glm5_lsp.diagnostics``.
No LSP types here.
"""
