"""Fixes that need no model: what the parsers, the linters and the symbol table already know.

Before the model is asked to fix anything, the pipeline (``Pipeline.fix``, ``Pipeline.fixes``)
asks :class:`QuickFixer`:

- ``parser``: syntax errors read as edits (a missing ``:``, ``)``, ``]``, ``}`` or quote; an
  indentation level; ``==`` for ``=``; a comma), from Python's compiler, ruff's parser and
  tree-sitter's ``MISSING`` nodes;
- ``ruff``: ruff's own fixes, safe ones first;
- ``names``: an undefined name respelled as the closest name in scope, or imported
  (``imports``); an attribute a module or class does not have respelled as one it has;
- ``rank``: each candidate spliced and judged like the model's (introduced diagnostics only), then
  ranked by fewest blocking diagnostics left and the smallest edit; ``fixer`` chains fixes where
  one reveals the next.

Each :class:`Fix` has a title that says what it does ("Insert missing ':'", "Replace 'ojb' with
'obj'", "Add 'import os'"), the whole fixed text and the diagnostics it leaves; the first of a
ranked list is the preferred one.
"""

from glm5_lsp.quickfix import imports, names
from glm5_lsp.quickfix.fixer import QuickFixer
from glm5_lsp.quickfix.rank import Fix

__all__ = ["Fix", "QuickFixer", "warm"]


def warm(code: str = "", path: str | None = None, seconds: float = 10.0, imported_from: bool = False) -> None:
    """What the first fix of ``code`` (the file at ``path``) would otherwise wait for, done now (a
    front end calls this when a file opens, beside ``pynames.jedi.warm_jedi``): the standard
    library's import index (about 0.3 s), the imports of the packages the file belongs to and imports
    from, and the attributes of the modules ``code`` reads attributes of (jedi, 0.1-2 s a module the
    first time; with ``imported_from``, of the modules it imports names from too)."""
    imports.warm(code, path)
    if code:
        names.warm(code, seconds, imported_from)
