"""The context engine: the one object the pipeline and the server hold for a workspace.

It owns the open documents, the symbol table and the API-doc index, keeps them current as the
editor reports changes, and builds prompts. Callers that only pass the whole text each time
(``build_prompt(text, offset, path=...)``, what the pipeline does) still get incremental parsing:
the engine diffs the new text against the document it holds and applies the difference as one edit. Hot-path methods (``update_document``,
``build_prompt``) never call jedi or read packages; :meth:`ContextEngine.warm` does that slow work
for one file and is meant to run in a worker after a document opens.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from glm5_lsp.context.apidocs import ApiDocIndex, ApiDocStats, installed_imports
from glm5_lsp.context.documents import Document, DocumentStore, Edit
from glm5_lsp.context.prompt import build_prompt, snippet_room
from glm5_lsp.context.sources import DEFAULT_MAX_BYTES, read_source
from glm5_lsp.context.summary import SymbolInfo
from glm5_lsp.context.symbols import IndexStats, SymbolTable
from glm5_lsp.context.tokens import TokenCounter
from glm5_lsp.pynames.scope import names_in_scope
from glm5_lsp.spans import Prompt
from glm5_lsp.textdiff import diff_regions, line_col

log = logging.getLogger(__name__)


class ContextEngine:
    """Documents, symbols and API docs of one workspace, and prompts built from them.

    ``cache_dir`` overrides where summaries and the index are cached (default: ``$GLM5_LSP_CACHE_DIR``
    or the user cache directory). Paths are normalised to absolute paths.
    """

    def __init__(
        self,
        workspace_root: str | os.PathLike[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_file_bytes: int = DEFAULT_MAX_BYTES,
        token_budget: int = 1024,
        api_doc_tokens: int | None = None,
        symbol_tokens: int | None = None,
        snippet_tokens: int | None = None,
        memory: Any = None,
    ) -> None:
        """``memory``: the workspace memory (``pipeline.memory.SessionMemory``: its ``snippets``),
        whose windows of recently edited files and longest match join the other open files'
        snippets, within ``snippet_tokens`` (and the snippets' share of the budget)."""
        self.cache_dir = cache_dir
        self.max_file_bytes = max_file_bytes
        self.token_budget = token_budget
        self.limits = {"api": api_doc_tokens, "symbols": symbol_tokens, "others": snippet_tokens}
        self.memory = memory
        self.documents = DocumentStore()
        self._counters: dict[int, TokenCounter] = {}
        self._set_root(workspace_root)

    def _set_root(self, workspace_root: str | os.PathLike[str] | None) -> None:
        self.root = Path(workspace_root).resolve() if workspace_root else None
        self.symbols = SymbolTable(self.root, self.cache_dir, self.max_file_bytes)
        self.apidocs = ApiDocIndex(self.root, self.cache_dir)
        for doc in self.documents:
            self.symbols.update_document(doc)

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
            for edit in _diff_edits(doc, change) if isinstance(change, str) else [change]:
                self.symbols.update_document(doc, doc.apply(edit))
        if version is not None:
            doc.version = version
        return doc

    def close_document(self, path: str | os.PathLike[str]) -> None:
        """Forget an open document; its on-disk version (if any) is summarised again."""
        key = self._key(path)
        self.documents.close(key)
        self.symbols.remove(key)
        if os.path.isfile(key) and self.root is not None and key.startswith(str(self.root)):
            self.symbols.index_file(Path(key))

    # -- slow work, off the keystroke path --------------------------------------------------
    def index_workspace(self, progress: Callable[[str], None] | None = None,
                        packages: bool = True) -> tuple[IndexStats, ApiDocStats]:
        """Summarise the workspace and build the API-doc index for the packages it imports."""
        stats = self.symbols.index_workspace((lambda p: progress(str(p))) if progress else None)
        modules = installed_imports(self._imported_modules()) if packages else []
        api = self.apidocs.index_workspace(modules, progress)
        self.apidocs.set_usage(self.symbols.api_usage())
        return stats, api

    def reindex(self, root: str | os.PathLike[str] | None = None) -> int:
        """(Re)build everything for ``root`` (default: the current root); returns the files indexed."""
        if root is not None and (self.root is None or Path(root).resolve() != self.root):
            self._set_root(root)
        stats, _ = self.index_workspace()
        for doc in self.documents:  # this is already off the keystroke path: resolve open files' imports too
            self.symbols.warm(doc.path)
        return stats.files

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
        self.resolve_imports(key)
        for module in self.packages_to_index(path):
            self.apidocs.add_package(module)
        self.apidocs.ensure_index()

    def resolve_imports(self, path: str | os.PathLike[str]) -> int:
        """Resolve one Python file's imports with jedi (slow); returns how many were resolved."""
        return self.symbols.warm(self._key(path))

    def packages_to_index(self, path: str | os.PathLike[str]) -> list[str]:
        """The installed packages one Python file imports that the API-doc index does not hold yet."""
        summary = self.symbols.files.get(self._key(path))
        if summary is None or summary.language != "python":
            return []
        return [module for module in installed_imports(imp.module for imp in summary.imports)
                if f"package:{module}" not in self.apidocs.sources]

    # -- prompts ----------------------------------------------------------------------------
    def build_prompt(
        self,
        text: str | None,
        offset: int,
        *,
        path: str | os.PathLike[str] | None = None,
        language: str | None = None,
        budget_tokens: int | None = None,
        error_lines: Iterable[int] = (),
        count_tokens: Callable[[str], int] | None = None,
    ) -> Prompt:
        """The prompt for a cursor at string ``offset`` of ``text`` (``None``: the open document's text).

        ``language`` is an LSP languageId (default: from the path); ``budget_tokens`` defaults to
        the engine's ``token_budget``; ``error_lines`` are 0-based lines a compiler flagged;
        ``count_tokens`` is the model tokenizer's ``len(encode(s))`` (default: 3 characters a token).
        """
        doc = self._document(text, path, language)
        # One memoising counter per counting function (the same tokenizer from call to call).
        counter = self._counters.get(id(count_tokens))
        if counter is None or (count_tokens is not None and counter.count_fn is not count_tokens):
            if len(self._counters) > 8:
                self._counters.clear()
            counter = self._counters[id(count_tokens)] = TokenCounter(count_tokens)
        others = [d for d in self.documents if d.path != doc.path]
        budget = budget_tokens or self.token_budget
        return build_prompt(doc, offset, budget, symbols=self.symbols,
                            apidocs=self.apidocs, other_docs=others, error_lines=error_lines,
                            count_tokens=counter, limits=self.limits,
                            remembered=self._remembered(doc, offset, budget))

    def _remembered(self, doc: Document, offset: int, budget: int) -> list[tuple[str, str]]:
        """The workspace memory's snippets for the cursor, ``(path, text)``, when the prompt has
        room for one (``snippet_room``)."""
        room = snippet_room(budget, self.limits)
        if self.memory is None or room <= 0 or doc.path.startswith("<"):
            return []
        try:
            found = self.memory.snippets(doc.path, doc.text, offset, max_chars=room * 3)
        except Exception:  # the memory is an aid: the prompt is built without it
            log.exception("the workspace memory's snippets failed")
            return []
        return [(s.key, s.text) for s in found]

    def names_at(self, text: str | None, offset: int, *, path: str | os.PathLike[str] | None = None,
                 language: str | None = None) -> list[SymbolInfo]:
        """Names that may follow the cursor: members after ``receiver.``, else the names in scope.

        Each answer is a :class:`SymbolInfo` (``name``, ``kind``, ``signature``); names without a
        definition in the table (builtins, jedi-listed members) have kind ``"name"``.
        """
        doc = self._document(text, path, language)
        offset = min(max(offset, 0), len(doc.text))
        line, col = doc.position(offset)
        before = doc.line(line)[:col]
        match = _RECEIVER.search(before)
        if match:
            names = self.symbols.members(match.group(1).replace(" ", ""), doc.path)
        elif doc.language == "python":  # read from the text as it is (``pynames.scope``): no parse needed
            typed = _TYPED.search(doc.text, max(0, offset - 200), offset)
            start = offset - (len(typed.group()) if typed else 0)
            names = sorted(names_in_scope(doc.text[:start], doc.text[offset:]))
        else:
            names = sorted(self.symbols.visible_names(doc.path, line, col))
        summary = self.symbols.files.get(doc.path)
        defined = {s.name: s for s in summary.symbols} if summary is not None else {}
        return [defined.get(n) or SymbolInfo(n, n, "name", n, doc.path, line, line) for n in names]

    def _document(self, text: str | None, path: str | os.PathLike[str] | None, language: str | None) -> Document:
        if path is None:
            from glm5_lsp.languages import detect_language

            lang = detect_language(None, language)
            path = f"<untitled-{lang}>"
        key = self._key(path) if not os.fspath(path).startswith("<") else os.fspath(path)
        doc = self.documents.get(key)
        if doc is None:
            if text is None:  # not open and no text given: read the file (empty if unreadable)
                source = read_source(key) if os.path.isfile(key) else None
                text = source.text if source is not None else ""
            return self.open_document(key, text, language)
        if text is not None and text != doc.text:
            self.update_document(key, [text])
        return doc


_RECEIVER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*)\s*\.\s*[A-Za-z0-9_]*$")
_TYPED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # the word being typed at the cursor


def _diff_edits(doc: Document, new: str) -> list[Edit]:
    """The edits turning ``doc.text`` into ``new``, in order: none, one, or two far apart
    (:func:`~glm5_lsp.textdiff.diff_regions`), so each re-parse and re-summary stays local."""
    edits = []
    old = doc.text
    for start, end, text in diff_regions(old, new):
        start_line, start_col = line_col(old, start)
        end_line, end_col = line_col(old, end)
        edits.append(Edit(start_line, start_col, end_line, end_col, text))
        old = old[:start] + text + old[end:]
    return edits
