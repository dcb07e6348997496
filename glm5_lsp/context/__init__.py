"""The context engine: what the model is shown for a cursor (no LSP types in here).

- ``documents``: text + tree-sitter trees, re-parsed incrementally (``languages`` loads grammars
  and the ``grammars/<lang>/*.scm`` queries; ``sources`` reads files safely).
- ``summary`` / ``symbols``: per-file and workspace symbol tables, cached by content hash, with the
  ``lookup`` / ``members`` / ``names_in_scope`` query API (``jedi_names`` resolves Python imports).
- ``apidoc_sources`` / ``apidocs`` / ``cursor_query``: the chunked API-doc index ranked with bm25s.
- ``prompt``: the budgeted prompt with role spans; ``engine``: :class:`ContextEngine`, which ties
  them together; ``cli``: ``glm5-lsp index``.

Heavy modules (tree-sitter grammars, jedi, bm25s, numpy) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glm5_lsp.context.documents import Edit
    from glm5_lsp.context.engine import ContextEngine
    from glm5_lsp.context.summary import SymbolInfo

__all__ = ["ContextEngine", "Edit", "SymbolInfo"]


def __getattr__(name: str) -> Any:
    if name == "ContextEngine":
        from glm5_lsp.context.engine import ContextEngine

        return ContextEngine
    if name == "Edit":
        from glm5_lsp.context.documents import Edit

        return Edit
    if name == "SymbolInfo":
        from glm5_lsp.context.summary import SymbolInfo

        return SymbolInfo
    raise AttributeError(name)
