"""The API-doc index: chunks from installed packages and workspace docs, ranked with BM25 (bm25s).

Sources are kept separately (``package:<module>``, ``doc:<relative path>``), each cached on disk
under a key that changes when its files change, so updating one source re-reads only that source.
The BM25 matrix over all chunks is rebuilt lazily on the next query after a change and saved with a
fingerprint of the source set, so a restart on an unchanged workspace loads it instead of rebuilding.
Scores are multiplied by a usage prior, ``1 + USAGE_PRIOR * log1p(calls)``, where ``calls`` counts
how often the workspace calls that API (what the workspace uses most is most likely wanted again).
BM25's best ``RERANK`` chunks are then re-ranked with what the cursor's own document says (see
:func:`cursor_factor`): the receiver's members it already calls in lines shaped like the cursor's,
and, in a condition, predicates (documented as "Test whether ..." or "Return True if").
:meth:`ApiDocIndex.top` returns only the best chunks that fit a token budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from glm5_lsp.context.apidoc_sources import (
    Chunk,
    doc_file_chunks,
    is_installed,
    locate_module,
    module_chunks,
    python_doc_chunks,
    submodule_alias,
)
from glm5_lsp.context.cursor_query import CursorQuery, prefix_tokens, receiver_prefix_tokens, tokenize
from glm5_lsp.context.sources import walk_files
from glm5_lsp.context.tokens import TokenCounter
from glm5_lsp.disk_cache import JsonCache, default_cache_dir
from glm5_lsp.languages import DOC_SUFFIXES

if TYPE_CHECKING:
    import bm25s

log = logging.getLogger(__name__)

SOURCES_VERSION = 3  # bump when chunk extraction or chunk tokens change (invalidates caches)
W_TITLE = 3  # title tokens are repeated so a symbol's own name outranks a mention in prose
USAGE_PRIOR = 0.5  # score *= 1 + USAGE_PRIOR * log1p(calls of the API in the workspace)
RERANK = 64  # BM25's best chunks re-ranked with the cursor's document signals
# score *= 1 + SHAPE_PRIOR * log1p(the API's calls in the document, weighted by likeness to the cursor's line)
SHAPE_PRIOR = 0.5
PREDICATE_BOOST = 1.5  # score *= this for a predicate when the cursor is in a condition
_PREDICATE_NAME = re.compile(r"(?:is|has)(?:_|[A-Z])")
_PREDICATE_DOC = re.compile(r"^\s*(?:tests?|checks?|returns?)\s+(?:whether|true\b|if\b)", re.IGNORECASE)


@dataclass
class ApiDocStats:
    packages: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    doc_files: int = 0
    chunks: int = 0
    rebuilt: bool = False


def chunk_tokens(chunk: Chunk) -> list[str]:
    """The BM25 document for a chunk: weighted title, structured tokens, then the text."""
    head = chunk.title.split("(", 1)[0]
    tokens = tokenize(head) * W_TITLE + tokenize(chunk.title[len(head):])
    # Reached through: the module for functions and classes, ``module.Class`` for methods.
    where = f"{chunk.module}.{chunk.owner}" if chunk.owner else chunk.module
    tokens.append(f"mod:{where.lower()}")
    if chunk.kind in ("function", "class", "method"):
        tokens.append(f"name:{chunk.name.lower()}")
        tokens += prefix_tokens(chunk.name)
        tokens += receiver_prefix_tokens(where, chunk.name)
    tokens += tokenize(chunk.text)
    return tokens


class ApiDocIndex:
    """Chunked, BM25-ranked API documentation for one workspace."""

    def __init__(self, root: str | os.PathLike[str] | None, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).resolve() if root else None
        base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._sources_cache = JsonCache(base, f"apidoc-sources-{SOURCES_VERSION}")
        ws = hashlib.blake2b(str(self.root).encode(), digest_size=8).hexdigest()
        self._state_dir = base / "v1" / "apidoc-index" / ws
        self.sources: dict[str, list[Chunk]] = {}
        self._source_keys: dict[str, str] = {}
        self._chunks: list[Chunk] = []
        self._retriever: bm25s.BM25 | None = None
        self._dirty = True
        self._lock = threading.RLock()
        self._usage: dict[str, int] = {}
        self._weights = None  # per-chunk usage prior, aligned with self._chunks
        self._weights_for: list[Chunk] | None = None

    # -- sources ----------------------------------------------------------------------------
    def add_package(self, module: str) -> int:
        """Index an installed module's public API; returns its chunk count (0 when skipped)."""
        path = locate_module(module)
        if path is None and submodule_alias(module) is None:
            log.info("API docs: %s is not installed (or not importable statically); skipped", module)
            return 0
        key = _file_key(f"package:{module}", path)
        chunks = self._cached_or(key, lambda: module_chunks(module))
        self._set_source(f"package:{module}", key, chunks)
        return len(chunks)

    def add_doc_file(self, path: Path) -> int:
        """Index one workspace doc (Markdown/reST sections, or a Python file's module/class docstrings)."""
        rel = self._rel(path)
        key = _file_key(f"doc:{rel}", path)
        if path.suffix in (".py", ".pyi"):
            module = rel.rsplit(".", 1)[0].replace("/", ".").removesuffix(".__init__")
            make = lambda: python_doc_chunks(path, rel, module)
        else:
            make = lambda: doc_file_chunks(path, rel)
        chunks = self._cached_or(key, make)
        self._set_source(f"doc:{rel}", key, chunks)
        return len(chunks)

    def remove_source(self, name: str) -> None:
        with self._lock:
            if self.sources.pop(name, None) is not None:
                self._source_keys.pop(name, None)
                self._dirty = True

    def _rel(self, path: Path) -> str:
        try:
            return path.resolve().relative_to(self.root).as_posix() if self.root else path.name
        except ValueError:
            return path.as_posix()

    def _cached_or(self, key: str, make: Callable[[], list[Chunk]]) -> list[Chunk]:
        data = self._sources_cache.get(key)
        if data is not None:
            try:
                return [Chunk(**row) for row in data]
            except TypeError:
                pass
        chunks = make()
        self._sources_cache.put(key, [asdict(c) for c in chunks])
        return chunks

    def _set_source(self, name: str, key: str, chunks: list[Chunk]) -> None:
        with self._lock:
            if self._source_keys.get(name) != key:
                self.sources[name] = chunks
                self._source_keys[name] = key
                self._dirty = True

    def index_workspace(
        self, imported_modules: Iterable[str], progress: Callable[[str], None] | None = None
    ) -> ApiDocStats:
        """Index the installed packages the workspace imports and the workspace's own docs."""
        stats = ApiDocStats()
        for module in sorted(set(imported_modules)):
            if progress is not None:
                progress(module)
            try:
                n = self.add_package(module)
            except Exception as err:  # noqa: BLE001 - a package that cannot be read never stops the others
                log.warning("API docs: %s failed (%s: %s); skipped", module, type(err).__name__, err)
                n = 0
            (stats.packages if n else stats.skipped).append(module)
        if self.root is not None and self.root.is_dir():
            for path in walk_files(self.root, DOC_SUFFIXES | {".py"}):
                if progress is not None:
                    progress(str(path))
                stats.doc_files += bool(self.add_doc_file(path))
        stats.rebuilt = self.ensure_index()
        stats.chunks = len(self._chunks)
        return stats

    # -- the BM25 index ------------------------------------------------------------------------
    def _fingerprint(self) -> str:
        text = json.dumps([SOURCES_VERSION, sorted(self._source_keys.items())])
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def ensure_index(self) -> bool:
        """Make the BM25 index match the sources: load the saved one or rebuild. True if rebuilt."""
        with self._lock:
            if not self._dirty:
                return False
            self._chunks = [c for name in sorted(self.sources) for c in self.sources[name]]
            self._dirty = False
            if not self._chunks:
                self._retriever = None
                return False
            fingerprint = self._fingerprint()
            if self._load_saved(fingerprint):
                return False
            import bm25s

            logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every build at DEBUG
            retriever = bm25s.BM25()
            retriever.index([chunk_tokens(c) or [""] for c in self._chunks], show_progress=False)
            self._retriever = retriever
            self._save(fingerprint)
            return True

    def _load_saved(self, fingerprint: str) -> bool:
        stamp = self._state_dir / "fingerprint"
        try:
            if stamp.read_text() != fingerprint:
                return False
            import bm25s

            self._retriever = bm25s.BM25.load(str(self._state_dir / "bm25"))
            return True
        except (OSError, ValueError) as err:
            if not isinstance(err, FileNotFoundError):
                log.info("saved API-doc index unreadable (%s); rebuilding", err)
            return False

    def _save(self, fingerprint: str) -> None:
        try:
            target = self._state_dir / "bm25"
            if target.exists():
                shutil.rmtree(target)
            self._state_dir.mkdir(parents=True, exist_ok=True)
            assert self._retriever is not None
            self._retriever.save(str(target))
            (self._state_dir / "fingerprint").write_text(fingerprint)
        except OSError as err:
            log.warning("cannot save the API-doc index (%s); it will be rebuilt next time", err)

    def search(self, query: CursorQuery | list[str], k: int = 10, packages: bool = True) -> list[tuple[Chunk, float]]:
        """The ``k`` best chunks with their BM25 scores (only positive scores).

        ``packages=False`` leaves out installed-package chunks (Python APIs are noise in a Go file).
        """
        self.ensure_index()
        tokens = query.tokens() if isinstance(query, CursorQuery) else list(query)
        retriever = self._retriever
        if retriever is None:
            return []
        ids = retriever.get_tokens_ids(tokens)
        if not ids:
            return []
        import numpy as np

        scores = retriever.get_scores(ids)
        if self._usage:
            scores = scores * self._usage_weights()
        if not packages:
            scores = scores * self._doc_mask()
        if isinstance(query, CursorQuery) and (query.shaped_calls or query.condition):
            n = min(max(k, RERANK), len(scores))
            pool = np.argpartition(-scores, n - 1)[:n]
            rescored = [(float(scores[i]) * cursor_factor(self._chunks[i], query), int(i)) for i in pool]
            rescored.sort(key=lambda pair: (-pair[0], pair[1]))
            return [(self._chunks[i], score) for score, i in rescored[:k] if score > 0]
        k = min(k, len(scores))
        best = np.argpartition(-scores, k - 1)[:k]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [(self._chunks[i], float(scores[i])) for i in best if scores[i] > 0]

    def set_usage(self, calls: dict[str, int]) -> None:
        """Workspace call counts of APIs (``SymbolTable.api_usage``): more-called APIs rank higher."""
        self._usage = dict(calls)
        self._weights_for = None

    def _usage_weights(self):
        import numpy as np

        if self._weights_for is not self._chunks:
            usage = self._usage
            counts = np.array([usage.get(f"{c.module}.{c.owner}.{c.name}" if c.owner else f"{c.module}.{c.name}", 0)
                               for c in self._chunks], dtype=np.float32)
            self._weights = (1.0 + USAGE_PRIOR * np.log1p(counts)).astype(np.float32)
            self._weights_for = self._chunks
        return self._weights

    def _doc_mask(self):
        import numpy as np

        if getattr(self, "_mask_for", None) is not self._chunks:
            self._mask = np.array([not c.origin.startswith("package:") for c in self._chunks], dtype=np.float32)
            self._mask_for = self._chunks
        return self._mask

    def top(self, query: CursorQuery | list[str], budget_tokens: int, count: TokenCounter | None = None,
            candidates: int = 24, packages: bool = True) -> list[Chunk]:
        """The best chunks that fit ``budget_tokens`` together, best first (see :meth:`search`).

        The best chunk is never dropped for being long: its documentation is cut to what fits
        (the signature line alone, at worst). Later chunks are taken whole or not at all.
        """
        count = count or TokenCounter()
        chosen: list[Chunk] = []
        left = budget_tokens
        for rank, (chunk, _) in enumerate(self.search(query, candidates, packages)):
            cost = count.cached(chunk.render()) + 1
            if cost > left and rank == 0:
                chunk = _cut(chunk, left, count)
                cost = count(chunk.render()) + 1 if chunk is not None else left + 1
            if chunk is not None and cost <= left:
                chosen.append(chunk)
                left -= cost
        return chosen

    def __len__(self) -> int:
        self.ensure_index()
        return len(self._chunks)


def is_predicate(chunk: Chunk) -> bool:
    """Whether a function answers yes or no: annotated ``-> bool``, named ``is_...``/``isFoo``/``has_...``,
    or documented as "Test whether ...", "Return True if ..." (``island`` is no predicate, so a name
    run together like ``isfile`` counts through its docs alone)."""
    if chunk.kind not in ("function", "method"):
        return False
    return (chunk.title.rstrip().endswith("-> bool") or _PREDICATE_NAME.match(chunk.name) is not None
            or _PREDICATE_DOC.match(chunk.text) is not None)


def cursor_factor(chunk: Chunk, query: CursorQuery) -> float:
    """How much the cursor's document raises a chunk's score (1.0: no evidence either way).

    Nothing raises a chunk whose name does not start with the letters typed: those already say more.
    """
    if not chunk.name.lower().startswith(query.typed.lower()):
        return 1.0
    key = f"{chunk.module}.{chunk.owner}.{chunk.name}" if chunk.owner else f"{chunk.module}.{chunk.name}"
    factor = 1.0 + SHAPE_PRIOR * math.log1p(query.shaped_calls.get(key, 0.0))
    if query.condition and is_predicate(chunk):
        factor *= PREDICATE_BOOST
    return factor


def _cut(chunk: Chunk, budget: int, count: TokenCounter) -> Chunk | None:
    """``chunk`` with its text cut at a line boundary to fit ``budget`` tokens (None if even the title cannot)."""
    if count(chunk.title) + 1 > budget:
        return None
    lines = chunk.text.splitlines()

    def cut(n: int) -> Chunk:
        return replace(chunk, text="\n".join(lines[:n]).rstrip() + (" ..." if 0 < n < len(lines) else ""))

    lo, hi = 0, len(lines)
    while lo < hi:  # the most lines that fit
        mid = (lo + hi + 1) // 2
        if count(cut(mid).render()) + 1 <= budget:
            lo = mid
        else:
            hi = mid - 1
    return cut(lo)


def _file_key(name: str, path: Path | None) -> str:
    try:
        stat = path.stat() if path is not None else None
        sig = f"{name}|{path}|{stat.st_mtime_ns}|{stat.st_size}" if stat else name
    except OSError:
        sig = name
    return hashlib.blake2b(sig.encode(), digest_size=16).hexdigest()


def installed_imports(modules: Iterable[str]) -> list[str]:
    """The imported module names that resolve to installed code (stdlib, site-packages, stubs).

    Relative imports and modules that only exist in the workspace are left out: the symbol table
    covers those.
    """
    out = []
    for module in sorted(set(modules)):
        if not module or module.startswith("."):
            continue
        path = locate_module(module)
        if path is None:
            alias = submodule_alias(module)
            path = locate_module(alias) if alias else None
        if path is not None and is_installed(path):
            out.append(module)
    return out
