"""The workspace symbol table: per-file summaries, the name query API, and budgeted rendering.

Summaries are cached on disk keyed by each file's content hash, so a restart on an unchanged
workspace parses nothing; open documents are re-summarised incrementally on every edit.

The query API (used by the repair layer to check generated names) is three calls:

- :meth:`SymbolTable.lookup` ``(name, path=None) -> SymbolInfo | None``: is ``name`` (possibly
  dotted) defined in ``path`` (its definitions, then its imports) or at the workspace's top level?
- :meth:`SymbolTable.members` ``(name, path=None) -> list[str]``: attribute names of a class or
  module (workspace classes with their workspace bases; imported Python modules through jedi).
- :meth:`SymbolTable.names_in_scope` ``(path, line, col) -> set[str]``: every name visible at a
  position (enclosing scopes, top level, imports, and Python's builtins).
"""

from __future__ import annotations

import builtins
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from glm5_lsp.context.documents import Document
from glm5_lsp.context.sources import DEFAULT_MAX_BYTES, read_source, walk_files
from glm5_lsp.context.summary import CONTAINER_KINDS, FileSummary, SymbolInfo, resummarize, summarize
from glm5_lsp.context.tokens import TokenCounter
from glm5_lsp.disk_cache import JsonCache, content_hash
from glm5_lsp.languages import SOURCE_SUFFIXES, detect_language, queries_fingerprint
from glm5_lsp.pynames.jedi_names import JediResolver

if TYPE_CHECKING:
    from glm5_lsp.context.documents import Change

log = logging.getLogger(__name__)

PYTHON_BUILTINS = frozenset(dir(builtins))
_BASES = re.compile(r"\(([^()]*)\)\s*$")
_MEMBER_KINDS = frozenset({"method", "field", "function", "class", "variable", "type"})


@dataclass
class IndexStats:
    """What one workspace pass did."""

    files: int = 0
    parsed: int = 0
    from_cache: int = 0
    skipped: int = 0
    symbols: int = 0
    languages: dict[str, int] = field(default_factory=dict)


class SymbolTable:
    """Summaries of every source file in a workspace plus the open documents."""

    def __init__(
        self,
        root: str | os.PathLike[str] | None,
        cache_dir: str | os.PathLike[str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        resolver: JediResolver | None = None,
    ) -> None:
        self.root = Path(root).resolve() if root else None
        self.max_bytes = max_bytes
        self.files: dict[str, FileSummary] = {}
        self.resolver = resolver or JediResolver(self.root, cache_dir)
        self._disk = JsonCache(cache_dir, "summaries")
        self.cache_dir = self._disk.dir.parent
        self._top: dict[str, dict[str, SymbolInfo]] = {}  # name -> path -> top-level symbol
        self._modules: dict[str, str] = {}  # dotted Python module name -> path
        self._entries: dict[str, tuple[FileSummary, list[_Entry]]] = {}
        self._open: dict[str, Document] = {}  # open documents, for refreshing stale summaries

    # -- building -----------------------------------------------------------------------
    def index_workspace(self, progress: Callable[[Path], None] | None = None) -> IndexStats:
        """Summarise every source file under the root, reusing cached summaries of unchanged files."""
        stats = IndexStats()
        if self.root is None:
            return stats
        for path in walk_files(self.root, SOURCE_SUFFIXES):
            if progress is not None:
                progress(path)
            stats.files += 1
            summary, parsed = self.index_file(path)
            if summary is None:
                stats.skipped += 1
                continue
            stats.parsed += parsed
            stats.from_cache += not parsed
            stats.symbols += len(summary.symbols)
            stats.languages[summary.language] = stats.languages.get(summary.language, 0) + 1
        return stats

    def index_file(self, path: Path) -> tuple[FileSummary | None, bool]:
        """Summarise one file from disk (cached by content hash); returns (summary or None, parsed)."""
        source = read_source(path, self.max_bytes)
        if source is None:
            return None, False
        key = os.fspath(path)
        language = detect_language(path)
        digest = content_hash(source.data)
        old = self.files.get(key)
        if old is not None and old.digest == digest and old.language == language:
            return old, False
        record = f"{language}-{queries_fingerprint(language)}-{digest}"
        data = self._disk.get(record)
        if data is not None:
            try:
                summary = FileSummary.from_json(data, key)
            except (KeyError, TypeError, ValueError) as err:
                log.warning("cached summary of %s is malformed (%s); re-parsing", path, err)
            else:
                self._store(summary)
                return summary, False
        doc = Document(key, source.text, language)
        summary = summarize(doc, digest)
        self._disk.put(record, summary.to_json())
        self._store(summary)
        return summary, True

    def update_document(self, doc: Document, change: Change | None = None) -> FileSummary:
        """Re-summarise an open document; ``change`` (from ``Document.apply``) makes it incremental."""
        self._open[doc.path] = doc
        old = self.files.get(doc.path)
        if old is not None and change is not None and old.language == doc.language:
            summary = resummarize(doc, old, change)
        else:
            summary = summarize(doc, usage=old.usage if old is not None and old.language == doc.language else None)
        self._store(summary)
        return summary

    def remove(self, path: str) -> None:
        self._open.pop(path, None)
        self._store(None, path)

    def _fresh(self, path: str | None) -> FileSummary | None:
        """The summary of ``path``, re-read in full first if edits left it stale."""
        summary = self.files.get(path) if path else None
        if summary is not None and summary.stale and path in self._open:
            summary = summarize(self._open[path], usage=summary.usage)
            self._store(summary)
        return summary

    def _store(self, summary: FileSummary | None, path: str | None = None) -> None:
        key = summary.path if summary is not None else path
        old = self.files.pop(key, None)
        if old is not None:
            for sym in old.top_level():
                by_path = self._top.get(sym.name)
                if by_path is not None:
                    by_path.pop(key, None)
                    if not by_path:
                        del self._top[sym.name]
        self._entries.pop(key, None)
        if summary is None:
            return
        self.files[key] = summary
        for sym in summary.top_level():
            self._top.setdefault(sym.name, {}).setdefault(key, sym)
        module = self._module_name(key)
        if module:
            self._modules[module] = key

    def _module_name(self, path: str) -> str | None:
        if self.root is None or not path.endswith((".py", ".pyi")):
            return None
        try:
            rel = Path(path).resolve().relative_to(self.root)
        except ValueError:
            return None
        parts = list(rel.with_suffix("").parts)
        if parts and parts[-1] == "__init__":
            parts.pop()
        if parts and parts[0] == "src" and len(parts) > 1:
            parts.pop(0)
        return ".".join(parts) or None

    # -- queries ------------------------------------------------------------------------
    def lookup(self, name: str, path: str | None = None) -> SymbolInfo | None:
        """Where ``name`` (``parse``, ``Parser.parse``, ``json.dumps``) is defined, or ``None``.

        With ``path``, that file's own definitions win, then its imports (an import answers with
        kind ``"import"`` and, for Python names jedi has already resolved, their signature and doc);
        then top-level definitions anywhere in the workspace. A dotted name reached through a Python
        import of an installed module (``json.dumps``) is resolved with jedi (slow once, then cached).
        """
        head, _, rest = name.partition(".")
        found = self._lookup_simple(head, path)
        if found is None or not rest:
            return found
        if found.kind == "import":
            return self._lookup_in_module(found.qualname + "." + rest, found)
        summary = self.files.get(found.path)
        if summary is None:
            return None
        wanted = found.qualname + "." + rest
        for sym in summary.symbols:
            if sym.qualname == wanted:
                return sym
        return None

    def _lookup_simple(self, name: str, path: str | None) -> SymbolInfo | None:
        summary = self._fresh(path)
        if summary is not None:
            nested = None
            for sym in summary.symbols:
                if sym.name == name and sym.kind != "parameter":
                    if sym.parent is None:
                        return sym
                    nested = nested or sym
            if nested is not None:
                return nested
            for imp in summary.imports:
                if imp.bound == name:
                    return self._import_symbol(imp.binds_to, name, summary.path, imp.line)
        by_path = self._top.get(name)
        if by_path:
            if path is not None:
                here = os.path.dirname(path)
                for p, sym in by_path.items():
                    if os.path.dirname(p) == here:
                        return sym
            return next(iter(by_path.values()))
        return None

    def _import_symbol(self, target: str, bound: str, path: str, line: int) -> SymbolInfo:
        resolved = self.resolver.cached(target)
        signature = resolved.render() if resolved is not None and resolved.found else f"import {target}"
        doc = resolved.doc.split("\n", 1)[0] if resolved is not None else ""
        return SymbolInfo(bound, target, "import", signature, path, line, line, None, doc)

    def _lookup_in_module(self, target: str, imported: SymbolInfo) -> SymbolInfo | None:
        parts = target.split(".")
        for cut in range(len(parts) - 1, 0, -1):  # the longest prefix that is a workspace module
            mod_path = self._modules.get(".".join(parts[:cut]))
            if mod_path is not None:
                wanted = ".".join(parts[cut:])
                return next((s for s in self.files[mod_path].symbols if s.qualname == wanted), None)
        attr = parts[-1]
        if not imported.path.endswith((".py", ".pyi")):
            return None
        resolved = self.resolver.resolve(target)  # jedi on first use, then cached on disk
        if resolved.found:
            return SymbolInfo(attr, target, "import", resolved.render(), imported.path, imported.line,
                              imported.line, None, resolved.doc.split("\n", 1)[0])
        return None

    def members(self, name: str, path: str | None = None) -> list[str]:
        """Attribute names of the class or module ``name`` (sorted; ``[]`` if unknown).

        Workspace classes include members inherited from workspace base classes. Imported Python
        modules and classes are listed by jedi (slow the first time, then cached on disk).
        """
        sym = self.lookup(name, path)
        if sym is None:
            if name in self._modules:
                return sorted({s.name for s in self.files[self._modules[name]].top_level()})
            if path is None or path.endswith((".py", ".pyi")):
                return self.resolver.members(name)
            return []
        if sym.kind == "import":
            if sym.qualname in self._modules:
                return sorted({s.name for s in self.files[self._modules[sym.qualname]].top_level()})
            return self.resolver.members(sym.qualname) if sym.path.endswith((".py", ".pyi")) else []
        return sorted(self._class_members(sym, depth=0))

    def _class_members(self, sym: SymbolInfo, depth: int) -> set[str]:
        summary = self.files.get(sym.path)
        if summary is None or depth > 4:
            return set()
        names = {s.name for s in summary.children(sym.qualname) if s.kind in _MEMBER_KINDS}
        bases = _BASES.search(sym.signature) if sym.kind == "class" else None
        if bases:
            for base in bases.group(1).split(","):
                base = base.strip().split("[", 1)[0]
                if base and "=" not in base:
                    found = self.lookup(base, sym.path)
                    if found is not None and found.kind == "class" and found is not sym:
                        names |= self._class_members(found, depth + 1)
        return names

    def visible_names(self, path: str, line: int, col: int = 0) -> set[str]:
        """Names visible at ``(line, col)`` of ``path`` by its symbol summary: enclosing scopes, top
        level, imports, builtins. (For the languages ``pynames`` does not read: Python's names in
        scope come from ``pynames.scope.names_in_scope``, which reads the text as typed.)

        Python rule: names bound in a class body are visible in the class body itself but not
        inside its methods (those reach them through ``self``/the class).
        """
        summary = self._fresh(path)
        if summary is None:
            return set(PYTHON_BUILTINS) if path.endswith(".py") else set()
        python = summary.language == "python"
        enclosing = [
            s for s in summary.symbols
            if s.kind in CONTAINER_KINDS and s.line <= line <= s.end_line and not (s.line == line and col == 0)
        ]
        innermost = enclosing[-1].qualname if enclosing else None
        scopes = {s.qualname for s in enclosing if not (python and s.kind == "class" and s.qualname != innermost)}
        names = {s.name for s in summary.symbols if (s.parent is None and s.kind != "parameter") or s.parent in scopes}
        names |= {imp.bound for imp in summary.imports if imp.bound}
        if python:
            names |= PYTHON_BUILTINS
        return names

    # -- rendering ----------------------------------------------------------------------
    def render(
        self,
        path: str,
        line: int,
        budget_tokens: int,
        count: TokenCounter,
        skip_lines: tuple[int, int] | None = None,
    ) -> list[str]:
        """Summary lines for a cursor, nearest and most-used first, cut to ``budget_tokens``.

        Order: the current file's definitions by distance from the cursor (those entirely inside
        ``skip_lines``, which the prompt shows verbatim, are left out), then the file's imports as
        jedi resolved them, most used first, then other files' top-level definitions that this
        file references, most referenced first.
        """
        summary = self.files.get(path)
        if summary is None or budget_tokens <= 0:
            return []
        entries = [e for e in self._file_entries(summary)
                   if not (skip_lines and skip_lines[0] <= e.line and e.end_line <= skip_lines[1])]
        entries.sort(key=lambda e: abs(e.line - line))
        ordered: list[list[str]] = [e.lines for e in entries]
        ordered += self._import_lines(summary)
        ordered += self._used_elsewhere(summary)
        out: list[str] = []
        left = budget_tokens
        for lines in ordered:
            for text in lines:
                cost = count.cached(text) + 1
                if cost > left:  # a class keeps the members that fit; an entry whose header does not is dropped
                    break
                out.append(text)
                left -= cost
            if left <= 0:
                break
        return out

    def _file_entries(self, summary: FileSummary) -> list[_Entry]:
        cached = self._entries.get(summary.path)
        if cached is not None and cached[0] is summary:
            return cached[1]
        members: dict[str, list[str]] = {}
        for sym in summary.symbols:
            if sym.parent is not None and sym.kind in _MEMBER_KINDS:
                members.setdefault(sym.parent, []).append("    " + sym.signature)
        entries = []
        seen: set[str] = set()
        for sym in summary.top_level():
            if sym.kind == "variable":  # a name assigned twice is listed once
                if sym.name in seen:
                    continue
                seen.add(sym.name)
            lines = [sym.signature]
            if sym.kind == "class":
                lines += members.get(sym.qualname, [])
            entries.append(_Entry(sym.line, sym.end_line, lines))
        self._entries[summary.path] = (summary, entries)
        return entries

    def _import_lines(self, summary: FileSummary) -> list[list[str]]:
        if summary.language != "python":
            return []
        scored = []
        for imp in summary.imports:
            resolved = self.resolver.cached(imp.target) if imp.bound else None
            if resolved is not None and resolved.found and resolved.kind != "module":
                scored.append((-summary.usage.get(imp.bound, 0), imp.line, resolved.render()))
        return [[text] for _, _, text in sorted(scored)]

    def _used_elsewhere(self, summary: FileSummary, limit: int = 40) -> list[list[str]]:
        found: list[tuple[int, str, list[str]]] = []
        for name, uses in summary.usage.items():
            by_path = self._top.get(name)
            if not by_path or summary.path in by_path:
                continue
            sym = next(iter(by_path.values()))
            found.append((-uses, name, [sym.signature]))
        found.sort()
        return [lines for _, _, lines in found[:limit]]

    def api_usage(self, exclude: str | None = None) -> dict[str, int]:
        """How often each imported API is called across the workspace (``{"os.path.join": 12}``).

        Dotted callees counted by the references query are resolved through each file's imports;
        ``exclude`` leaves one file out.
        """
        counts: dict[str, int] = {}
        for summary in self.files.values():
            if summary.path != exclude:
                for target, n in file_api_usage(summary).items():
                    counts[target] = counts.get(target, 0) + n
        return counts

    def warm(self, path: str, limit: int = 64) -> int:
        """Resolve a Python file's imports with jedi (slow; call it off the keystroke path)."""
        summary = self.files.get(path)
        if summary is None or summary.language != "python":
            return 0
        done = 0
        for imp in summary.imports[:limit]:
            if imp.bound and not imp.module.startswith(".") and imp.target not in self._modules:
                self.resolver.resolve(imp.target)
                done += 1
        return done

    def summaries(self) -> Iterable[FileSummary]:
        return self.files.values()


def file_api_usage(summary: FileSummary) -> dict[str, int]:
    """One Python file's calls of imported APIs, by resolved dotted name (``{"re.compile": 2}``)."""
    if summary.language != "python":
        return {}
    aliases = {imp.bound: imp.binds_to for imp in summary.imports if imp.bound}
    counts: dict[str, int] = {}
    for key, n in summary.usage.items():
        head, dot, rest = key.partition(".")
        if dot and head in aliases:
            target = f"{aliases[head]}.{rest}"
            counts[target] = counts.get(target, 0) + n
    return counts


@dataclass
class _Entry:
    line: int
    end_line: int
    lines: list[str]
