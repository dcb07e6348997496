"""The context engine: the one object the pipeline and the server hold for a workspace.

It owns the open documents, the symbol table and the API-doc index, keeps them current as the
editor reports changes, and builds prompts. Hot-path methods (``update_document``,
``build_prompt``) never call jedi or read packages; :meth:`ContextEngine.warm` does that slow work
for one file and is meant to run in a worker after a document opens.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Callable, Iterable

from glm5_lsp.context.apidocs import ApiDocIndex, ApiDocStats, installed_imports
from glm5_lsp.context.documents import Document, DocumentStore, Edit
from glm5_lsp.context.prompt import build_prompt
from glm5_lsp.context.sources import DEFAULT_MAX_BYTES
from glm5_lsp.context.symbols import IndexStats, SymbolTable
from glm5_lsp.context.tokens import TokenCounter
from glm5_lsp.spans import Prompt

log = logging.getLogger(__name__)


class ContextEngine:
    """Documents, symbols and API docs of one workspace, and prompts built from them.

    ``cache_dir`` overrides where summaries and the index are cached (default: ``$GLM5_LSP_CACHE_DIR``
    or the user cache directory). Paths are normalised to absolute paths.
    """

    def __init__(
        self,
        workspace_root: str | os.PathLike[str] | None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_file_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.root = Path(workspace_root).resolve() if workspace_root else None
        self.documents = DocumentStore()
        self.symbols = SymbolTable(self.root, cache_dir, max_file_bytes)
        self.apidocs = ApiDocIndex(self.root, cache_dir)
        self._counters: dict[int, TokenCounter] = {}

    @staticmethod
    def _key(path: str | os.PathLike[str]) -> str:
        return os.path.abspath(os.fspath(path))

    # -- documents --------------------------------------------------------------------------
    def open_document(self, path: str | os.PathLike[str], text: str, language_id: str | None = None,
                      version: int = 0) -> Document:
        doc = self.documents.open(self._key(path), text, language_id, version)
        self.symbols.update_document(doc)
        return doc

    def update_document(self, path: str | os.PathLike[str], changes: Iterable[Edit | str],
                        version: int | None = None) -> Document:
        """Apply editor changes (``Edit`` ranges or whole-text strings); re-summarise incrementally."""
        key = self._key(path)
        doc = self.documents.get(key)
        if doc is None:
            raise KeyError(f"document {key} is not open")
        for change in changes:
            if isinstance(change, str):
                doc.replace(change)
                self.symbols.update_document(doc)
            else:
                self.symbols.update_document(doc, doc.apply(change))
        if version is not None:
            doc.version = version
        return doc

    def close_document(self, path: str | os.PathLike[str]) -> None:
        """Forget an open document; its on-disk version (if any) is summarised again."""
        key = self._key(path)
        self.documents.close(key)
        self.symbols.remove(key)
        if os.path.isfile(key) and self.root is not None and key.startswith(str(self.root)):
            self.symbols._index_file(Path(key))

    # -- slow work, off the keystroke path --------------------------------------------------
    def index_workspace(self, progress: Callable[[str], None] | None = None,
                        packages: bool = True) -> tuple[IndexStats, ApiDocStats]:
        """Summarise the workspace and build the API-doc index for the packages it imports."""
        stats = self.symbols.index_workspace((lambda p: progress(str(p))) if progress else None)
        modules = installed_imports(self._imported_modules()) if packages else []
        api = self.apidocs.index_workspace(modules, progress)
        return stats, api

    def _imported_modules(self) -> set[str]:
        out: set[str] = set()
        for summary in self.symbols.summaries():
            if summary.language == "python":
                out |= {imp.module for imp in summary.imports if not imp.module.startswith(".")}
        return out

    def warm(self, path: str | os.PathLike[str]) -> None:
        """Resolve one Python file's imports with jedi and index the packages it imports."""
        key = self._key(path)
        summary = self.symbols.files.get(key)
        if summary is None or summary.language != "python":
            return
        self.symbols.warm(key)
        for module in installed_imports(imp.module for imp in summary.imports):
            if f"package:{module}" not in self.apidocs.sources:
                self.apidocs.add_package(module)
        self.apidocs.ensure_index()

    # -- prompts ----------------------------------------------------------------------------
    def build_prompt(
        self,
        path: str | os.PathLike[str],
        text: str | None,
        offset: int,
        budget_tokens: int,
        error_lines: Iterable[int] = (),
        count_tokens: Callable[[str], int] | None = None,
    ) -> Prompt:
        """The prompt for a cursor at string ``offset``; ``text`` (if given) is the document's current text.

        ``error_lines`` are 0-based lines a compiler flagged; ``count_tokens`` is the model
        tokenizer's ``len(encode(s))`` (default: one token per three characters).
        """
        key = self._key(path)
        doc = self.documents.get(key)
        if doc is None:
            doc = self.open_document(key, text or "")
        elif text is not None and text != doc.text:
            self.update_document(key, [text])
        counter = self._counters.get(id(count_tokens))
        if counter is None or counter.count_fn is not (count_tokens or counter.count_fn):
            counter = self._counters[id(count_tokens)] = TokenCounter(count_tokens)
        others = [d for d in self.documents if d.path != key]
        return build_prompt(doc, offset, budget_tokens, symbols=self.symbols, apidocs=self.apidocs,
                            other_docs=others, error_lines=error_lines, count_tokens=counter)
