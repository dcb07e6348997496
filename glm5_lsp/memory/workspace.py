"""The memory of one workspace: its files and its libraries as token ids, indexed for suffix matches.

Shards, newest last (a document lives in exactly one; the older copies are marked dead):

- ``libraries``: the standard library and the installed distributions the workspace imports
  (:mod:`~glm5_lsp.memory.libraries`: built once per set, cached on disk, shared);
- ``base``: the workspace's files as :meth:`WorkspaceMemory.index_folder` found them;
- ``frozen``: earlier edits, folded together once ``recent`` grows past ``recent_tokens``;
- ``recent``: the documents edited before the one being edited now;
- ``hot``: the document being edited, searched by scanning (:class:`~glm5_lsp.memory.index.ScanIndex`:
  no suffix array to rebuild on each keystroke), its ids re-tokenized only around the change
  (:class:`~glm5_lsp.memory.tokens.TokenizedText`).

A change to another document moves the previous hot one into ``recent`` (rebuilt: it holds only
edited documents). :meth:`compact` folds everything but the libraries back into one base shard.
All methods are thread-safe; a request's matcher keeps the shards it started with.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from glm5_lsp.memory.index import ScanIndex, SuffixIndex
from glm5_lsp.memory.libraries import (
    LibraryCache,
    imported_modules,
    libraries_for,
    local_modules,
    read_source,
)
from glm5_lsp.memory.lines import LineGuess, LineIndex
from glm5_lsp.memory.matcher import MAX_MATCH, Matcher, Source
from glm5_lsp.memory.tokens import Encoder, TokenizedText, encode_batch, token_dtype

log = logging.getLogger(__name__)
_PENDING = re.compile(r" ?\w*\Z")  # the word being typed at the cursor, with the space before it

Progress = Callable[[str, float], None]  # (message, fraction done)
SOURCE_SUFFIXES = (".py", ".pyi")
SKIPPED_FOLDERS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox",
                             ".nox", ".mypy_cache", ".pytest_cache", ".ruff_cache", "build", "dist", ".eggs"})


@dataclass
class MemorySettings:
    """Sizes and sources. The defaults bound a workspace's memory to a few hundred megabytes."""

    enabled: bool = True
    libraries: bool = True  # the installed distributions the workspace imports
    stdlib: bool = True  # and the standard library
    max_files: int = 5_000  # workspace files indexed (the first ones in path order past it are kept)
    max_file_bytes: int = 1_000_000  # a workspace file larger than this is left out
    library_file_bytes: int = 200_000
    max_library_tokens: int = 16_000_000  # ids of library code (about 100 MB with its suffix array)
    shorter_suffixes: bool = False  # decode with the level gate: shorter suffixes' estimates mixed in too
    recent_tokens: int = 400_000  # ``recent`` past this is frozen and a new one begins
    max_match: int = MAX_MATCH
    suffixes: tuple[str, ...] = SOURCE_SUFFIXES


@dataclass
class MemoryStats:
    files: int = 0
    tokens: int = 0
    library_tokens: int = 0
    bytes: int = 0
    build_seconds: float = 0.0
    library_seconds: float = 0.0
    libraries: list[str] = field(default_factory=list)
    library_cached: bool = False
    shards: int = 0
    dead_tokens: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def tokenizer_digest(tokenizer: Encoder) -> str:
    """A stable digest of a tokenizer's vocabulary and merges (the libraries' cache key)."""
    inner = getattr(tokenizer, "_tok", None)
    payload = inner.to_str() if inner is not None and hasattr(inner, "to_str") else repr(
        [tokenizer.encode(chr(c)) for c in range(32, 127)])
    return hashlib.blake2b(payload.encode(), digest_size=16).hexdigest()


class WorkspaceMemory:
    """See the module docstring. Keys are the documents' paths as strings (an ``untitled:`` name
    for a buffer with no file)."""

    def __init__(self, tokenizer: Encoder, settings: MemorySettings | None = None,
                 cache_dir: Path | None = None) -> None:
        self.tokenizer = tokenizer
        self.settings = settings or MemorySettings()
        self.dtype = token_dtype(tokenizer.vocab_size)
        self.cache_dir = cache_dir
        self._lock = threading.RLock()
        self.libraries: SuffixIndex | None = None
        self.base: SuffixIndex | None = None
        self.frozen: list[SuffixIndex] = []
        self.recent: SuffixIndex | None = None
        self.hot: ScanIndex | None = None
        self._hot_key: str | None = None
        self._edited: dict[str, TokenizedText] = {}  # documents edited since they were indexed
        self.lines = LineIndex()  # the workspace's lines (not the libraries'), as the documents read now
        self.stats = MemoryStats()
        self.root: Path | None = None

    # ---- building -------------------------------------------------------------------------------

    def index_folder(self, root: str | os.PathLike[str], progress: Progress | None = None,
                     libraries: bool | None = None, recursive: bool = True) -> MemoryStats:
        """Index every source file under ``root`` (the base shard; ``recursive`` False: the files
        of ``root`` itself only) and, unless turned off, the libraries its files import. Replaces
        whatever the memory held."""
        started = time.perf_counter()
        root = Path(root).resolve()
        if not root.is_dir():
            raise ValueError(f"cannot index {root}: not a folder")
        paths = source_files(root, self.settings, recursive)
        # Read, tokenized and let go a batch at a time: only the ids (2 bytes a token) and the names
        # imported stay (holding every text and its tokenizer output at once was most of the peak).
        docs: list[tuple[str, np.ndarray]] = []
        lines = LineIndex()
        imports: set[str] = set()
        batch = 128
        for start in range(0, len(paths), batch):
            part = []
            for path in paths[start:start + batch]:
                text = workspace_text(path, self.settings)
                if text is not None:
                    part.append((str(path), text))
            imports |= imported_modules(t for _, t in part)
            for key, text in part:
                lines.set(key, text)
            for (key, _), ids in zip(part, encode_batch(self.tokenizer, [t for _, t in part])):
                docs.append((key, np.asarray(ids, dtype=self.dtype)))
            del part
            if progress is not None:
                done = min(start + batch, len(paths))
                progress(f"reading {done}/{len(paths)} files", 0.6 * done / max(len(paths), 1))
        if progress is not None:
            progress("indexing the workspace", 0.6)
        base = SuffixIndex.build(docs, self.dtype, consume=True)
        self._rebase(root, base, lines)
        self.stats.build_seconds = round(time.perf_counter() - started, 3)
        use_libraries = self.settings.libraries if libraries is None else libraries
        if use_libraries or self.settings.stdlib:
            self.load_libraries((), local_modules(root, paths), progress, distributions=use_libraries,
                                imports=imports)
        self._refresh_stats()
        if progress is not None:
            progress("memory ready", 1.0)
        return self.stats

    def _rebase(self, root: Path, base: SuffixIndex, lines: LineIndex | None = None) -> None:
        """``base`` becomes the workspace's shard. The documents edited meanwhile (opened in the
        editor while the folder was read: their text is the editor's, not the disk's) stay as they
        read now: dead in the new base, the one being edited still hot, the others in ``recent``."""
        with self._lock:
            for key in self._edited:
                base.kill(key)
            others = [(k, doc.ids) for k, doc in self._edited.items() if k != self._hot_key]
            if lines is not None:
                for key, doc in self._edited.items():
                    lines.set(key, doc.text)
                self.lines = lines
            self.root = root
            self.base, self.frozen = base, []
            self.recent = SuffixIndex.build(others, self.dtype) if others else None

    def load_libraries(self, texts: Iterable[str], local: Iterable[str] = (), progress: Progress | None = None,
                       distributions: bool = True, imports: set[str] | None = None) -> None:
        """The libraries' shard for code that reads like ``texts`` (their imports, or the module
        names ``imports`` already read from them), ``local`` names being the workspace's own."""
        from glm5_lsp.memory.libraries import stdlib_library

        cache = LibraryCache(self.tokenizer, tokenizer_digest(self.tokenizer), self.cache_dir)
        if distributions:
            named = imported_modules(texts) | (imports or set())
            chosen = libraries_for(named, local, self.settings.library_file_bytes,
                                   stdlib=self.settings.stdlib)
        else:
            chosen = [stdlib_library(self.settings.library_file_bytes)] if self.settings.stdlib else []

        def scaled(message: str, fraction: float) -> None:
            if progress is not None:
                progress(message, 0.6 + 0.4 * fraction)

        index, report = cache.shard(chosen, self.settings.max_library_tokens, scaled)
        with self._lock:
            self.libraries = index
        self.stats.libraries = report["libraries"]
        self.stats.library_seconds = report["seconds"]
        self.stats.library_cached = report["cached"]
        self._refresh_stats()

    # ---- documents ------------------------------------------------------------------------------

    def update(self, key: str, text: str) -> bool:
        """The document ``key`` now reads ``text`` (opened, changed, saved, or changed on disk).
        Returns False when that is what the memory holds already."""
        with self._lock:
            doc = self._edited.get(key)
            if doc is not None and doc.text == text and self._hot_key == key:
                return False
            if doc is None:
                doc = TokenizedText(self.tokenizer, text)
                self._edited[key] = doc
            else:
                doc.update(text)
            if self._hot_key != key:
                for shard in self._older_shards():
                    shard.kill(key)
                self._demote_hot()
            self.hot = ScanIndex(key, doc.ids)  # no suffix array to build: scanned
            self._hot_key = key
            self.lines.set(key, text)
            return True

    def ids_before(self, key: str, document: str, end: int, need: int) -> list[int] | None:
        """The ids of ``document[:end]`` (``end`` a chunk start), or of its last chunks where those
        hold more than ``need`` ids, from the memory's own tokens of document ``key`` where it holds
        that text; None where it does not (the caller encodes it)."""
        with self._lock:
            doc = self._edited.get(key)
            if doc is None:
                return None
            found = doc.ids_before(end, need)
            if found is None:
                return None
            start, ids = found
            if doc.text[start:end] != document[start:end] or len(doc.text) < end:
                return None
            return ids.tolist()

    def remove(self, key: str) -> bool:
        """Forget a document (deleted, or renamed away). False when the memory did not hold it."""
        with self._lock:
            found = False
            for shard in [*self._older_shards(), self.hot]:
                if shard is not None:
                    found = shard.kill(key) or found
            if self._edited.pop(key, None) is not None:
                found = True
            found = self.lines.remove(key) or found
            if self._hot_key == key:
                self.hot, self._hot_key = None, None
            if self.recent is not None and not self.recent.live_keys():
                self.recent = None
            return found

    def rename(self, old: str, new: str) -> None:
        """A document moved: its text is kept under its new name."""
        with self._lock:
            text = self.text_of(old)
            self.remove(old)
            if text is not None:
                self.update(new, text)

    def refresh(self, key: str) -> bool:
        """Read ``key`` from disk again (changed outside the editor, or deleted: then removed), as
        the first build reads it (``workspace_text``): a file it would leave out is removed."""
        text = workspace_text(Path(key), self.settings) if Path(key).is_file() else None
        if text is None:
            return self.remove(key)
        return self.update(key, text)

    def text_of(self, key: str) -> str | None:
        """The text the memory holds for a document (an edited one's, or the file's on disk)."""
        with self._lock:
            doc = self._edited.get(key)
            if doc is not None:
                return doc.text
            for shard in self._older_shards():  # its ids, not the disk's text: an edit may be compacted in
                if shard.has(key):
                    return self.tokenizer.decode([int(t) for t in shard.document(key)])
            return None

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._edited or any(shard.has(key) for shard in self._older_shards())

    def documents(self) -> list[str]:
        with self._lock:
            keys = set(self._edited)
            for shard in self._older_shards():
                keys.update(shard.live_keys())
            return sorted(keys)

    def compact(self) -> None:
        """Fold every workspace shard into one base shard (no dead positions left)."""
        with self._lock:
            docs = []
            for shard in [self.base, *self.frozen, self.recent, self.hot]:
                if shard is None:
                    continue
                for key in shard.live_keys():
                    edited = self._edited.get(key)
                    docs.append((key, edited.ids if edited is not None else np.array(shard.document(key))))
            self.base = SuffixIndex.build(docs, self.dtype)
            self.frozen, self.recent, self.hot, self._hot_key = [], None, None, None
            self._edited.clear()
        self._refresh_stats()

    def _older_shards(self) -> list[SuffixIndex]:
        return [s for s in (self.base, *self.frozen, self.recent) if s is not None]

    def _demote_hot(self) -> None:
        """The hot document joins ``recent`` (rebuilt from the edited documents it holds)."""
        if self._hot_key is None:
            return
        key = self._hot_key
        keys = [k for k in (self.recent.live_keys() if self.recent is not None else []) if k != key] + [key]
        docs = [(k, self._edited[k].ids) for k in keys if k in self._edited]
        if self.recent is not None and self.recent.live_tokens + len(self._edited[key].ids) > self.settings.recent_tokens:
            self.frozen.append(self.recent)  # full: keep it as it is, start a new one with this document
            docs = [(key, self._edited[key].ids)]
            for k in keys[:-1]:
                self._edited.pop(k, None)  # their ids live in the frozen shard now
        self.recent = SuffixIndex.build(docs, self.dtype)
        self.hot, self._hot_key = None, None

    # ---- queries --------------------------------------------------------------------------------

    def sources(self, key: str | None = None, exclude: tuple[int, int] | None = None) -> list[Source]:
        """The shards as a request sees them: ``exclude`` (token positions of document ``key``,
        which must be the hot one) never counts as what followed a match."""
        with self._lock:
            shards = [s for s in (self.libraries, self.base, *self.frozen, self.recent) if s is not None]
            out = [Source(s) for s in shards]
            if self.hot is not None:
                hot_exclude = None
                if exclude is not None and key is not None and key == self._hot_key:
                    span = self.hot.span(key)
                    assert span is not None
                    hot_exclude = (span[0] + exclude[0], span[0] + exclude[1])
                out.append(Source(self.hot, hot_exclude, own=key is not None and key == self._hot_key))
            return out

    def matcher(self, key: str | None = None, document: str | None = None, prefix_end: int | None = None) -> Matcher:
        """A matcher for a request in document ``key`` whose prompt's code ends at character
        ``prefix_end`` of ``document``: the document is brought up to date first, and what follows
        the cursor's own line there is excluded (the prefix would otherwise find itself and predict
        the text after the cursor, the next line). The exclusion starts where the word being typed
        does (its leading space included), not at the cursor: a context whose last word is still
        pending (``import ty`` is ``import``, `` t``, ``y``: matched up to ``import``) ends before
        the cursor's token, and found itself there."""
        exclude = None
        # One hold of the lock from the update to the shards: an update of another document in
        # between (the server's memory work runs on its own threads) would make this one no longer
        # the hot document, or move its tokens into a frozen shard, and the exclusion would be lost.
        with self._lock:
            if key is not None and document is not None:
                self.update(key, document)
                if prefix_end is not None:
                    doc = self._edited[key]
                    line_end = document.find("\n", prefix_end)
                    line_start = document.rfind("\n", 0, prefix_end) + 1
                    typed = _PENDING.search(document, line_start, prefix_end)
                    word_start = typed.start() if typed is not None else prefix_end
                    first = doc.token_at(max(0, min(word_start, prefix_end - 1)))
                    last = doc.token_at(line_end) + 1 if line_end >= 0 else len(doc.ids) + 1
                    exclude = (first, last)
            sources = self.sources(key, exclude)
        return Matcher(sources, self.settings.max_match)

    def matcher_before(self, key: str, offset: int) -> Matcher:
        """A matcher in which document ``key`` (the one last updated: ``update``) counts only up to
        character ``offset``: from the token holding it on, nothing there is what followed a match
        (for scoring a file token by token with its own text above in the memory, ``memory.fit``)."""
        with self._lock:
            if key != self._hot_key:
                raise ValueError(f"{key} is not the document last updated")
            doc = self._edited[key]
            exclude = (doc.token_at(offset), len(doc.ids) + 1)
        return Matcher(self.sources(key, exclude), self.settings.max_match)

    def line_guess(self, key: str | None, document: str, offset: int) -> LineGuess | None:
        """How the workspace's other lines go on from the cursor's line as typed before ``offset``
        (``memory.lines``): document ``key`` is brought up to date first, its cursor line not counted."""
        if key is not None:
            self.update(key, document)
        start = document.rfind("\n", 0, offset) + 1
        end = document.find("\n", offset)
        line = document[start:] if end < 0 else document[start:end]
        return self.lines.guess(document[start:offset], key=key, line=line)

    def _refresh_stats(self) -> None:
        with self._lock:
            workspace = [s for s in (self.base, *self.frozen, self.recent, self.hot) if s is not None]
            self.stats.files = len(self.documents())
            self.stats.tokens = sum(s.live_tokens for s in workspace)
            self.stats.library_tokens = len(self.libraries) if self.libraries is not None else 0
            self.stats.bytes = sum(s.nbytes for s in workspace) + (self.libraries.nbytes if self.libraries is not None else 0)
            self.stats.shards = len(workspace) + (self.libraries is not None)
            self.stats.dead_tokens = sum(s.dead_tokens for s in workspace)


def source_files(root: Path, settings: MemorySettings, recursive: bool = True) -> list[Path]:
    """The workspace's source files, in path order, at most ``settings.max_files``; with
    ``recursive`` False, those of ``root`` itself only (not of its folders)."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_FOLDERS and not d.startswith(".")) if recursive else []
        for name in sorted(files):
            if name.endswith(settings.suffixes):
                found.append(Path(folder) / name)
    found.sort()
    return found[: settings.max_files]


def workspace_text(path: Path, settings: MemorySettings) -> str | None:
    """A workspace file's text as the first build reads it: None for a file over
    ``settings.max_file_bytes``, one gone since it was listed, or one that is not UTF-8 source
    (``libraries.read_source``)."""
    try:
        return read_source(path) if path.stat().st_size <= settings.max_file_bytes else None
    except OSError:
        return None


def as_key(path: str | os.PathLike[str] | None) -> str:
    """A document's key: its absolute path, or ``untitled:`` for a buffer with none."""
    return str(Path(path).resolve()) if path else "untitled:"


def keys_under(memory: WorkspaceMemory, folder: str) -> Sequence[str]:
    prefix = str(Path(folder).resolve()) + os.sep
    return [k for k in memory.documents() if k.startswith(prefix)]
