"""One suffix array over a set of documents' token ids (a *shard* of the memory).

The documents' ids are laid end to end, each followed by the separator (an id no token has, so no
match runs from one document into the next), and every position is sorted by the suffix that starts
there (``pydivsufsort``: libdivsufsort on the ids as big-endian bytes, which sorts them in token
order; 4 million tokens in under a second). The suffixes that begin with a token sequence then form
one range of the array, found by narrowing token by token (:meth:`SuffixIndex.narrow`): binary
searches over the range, in C (``glm5_lsp/native.c``) where the extension is built, else a Python
binary search that turns into a vectorised ``searchsorted`` once the range is small.

A shard never changes its ids; a document that changed or went away is marked dead (its positions'
``alive`` flags cleared) and lives on in a newer shard. Counting skips dead positions and a caller's
excluded range (the cursor's own line, which would otherwise predict itself).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from glm5_lsp.memory.tokens import separator

try:
    from glm5_lsp import _native
except ImportError:  # built without a C compiler: the searches below run in numpy
    _native = None

SMALL_RANGE = 512  # at most this many suffixes: narrow with one vectorised gather and searchsorted
SAMPLE = 2048  # at most this many occurrences are read for a distribution (evenly spaced)


def release_freed_memory() -> None:
    """Hand the C heap's freed pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).
    A build that tokenized millions of ids in batches leaves hundreds of MB freed but still held by
    the allocator, under the suffix array it builds next."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


ALIGN_CHUNK = 1 << 20  # byte positions read at a time when the byte-level array is cut to whole tokens


def suffix_array(tokens: np.ndarray, in_place: bool = False) -> np.ndarray:
    """The suffix array of ``tokens`` (int32 positions, or int64 past 2**31 tokens).

    libdivsufsort sorts bytes: wider ids are written big-endian (so byte order is numeric order),
    the suffixes of every byte position sorted, and those at whole-token positions kept, in order.
    ``pydivsufsort`` does that for such an array too, but with a whole-array temporary at every step
    of the cut (about 14 bytes a token on top of the sort's own 4 a byte: 450 MB for the libraries'
    16M tokens). Here libdivsufsort writes into an array of ours, the whole-token positions are moved
    to its front a chunk at a time, and the array is shrunk in place to them: 4 bytes a byte at the
    most, then 4 a token. ``in_place``: the ids may be byte-swapped in place meanwhile (and are
    swapped back), instead of copied (the caller's own array, that no one reads until this returns)."""
    if len(tokens) == 0:
        return np.zeros(0, dtype=np.int32)
    try:
        from pydivsufsort import divsufsort
    except ImportError:  # pragma: no cover - a declared dependency; the fallback is slow but correct
        return _suffix_array_numpy(tokens)
    if tokens.dtype.kind != "u":
        raise TypeError(f"token ids must be unsigned, not {tokens.dtype}")
    width = tokens.dtype.itemsize
    if width == 1:
        return np.ascontiguousarray(divsufsort(np.ascontiguousarray(tokens)))
    swap = in_place and tokens.flags.writeable and tokens.flags.c_contiguous and tokens.dtype.byteorder in "=<"
    if swap and np.little_endian:
        tokens.byteswap(inplace=True)  # now big-endian bytes under the same dtype
        data = tokens.view(np.uint8)
    else:
        swap = False
        data = tokens.astype(f">u{width}").view(np.uint8)
    try:
        by_byte = _divsufsort_into(data)
        if by_byte is None:  # pydivsufsort's library out of reach: its own (costlier) way
            by_byte = divsufsort(data)
    finally:
        if swap:
            tokens.byteswap(inplace=True)
    del data
    out = by_byte if by_byte.flags.owndata and by_byte.dtype == np.int32 else None
    if out is None:
        out = np.empty(len(tokens), dtype=np.int32 if len(tokens) < 2**31 else np.int64)
    at = 0
    for start in range(0, len(by_byte), ALIGN_CHUNK):
        part = by_byte[start:start + ALIGN_CHUNK]
        whole = part[part % width == 0] // width  # a copy: writing it at ``at <= start`` below is safe
        out[at:at + len(whole)] = whole
        at += len(whole)
    if at != len(tokens):  # every token position is one byte position: this cannot happen
        raise RuntimeError(f"suffix array: {at} whole-token positions for {len(tokens)} tokens")
    if out is by_byte:
        del part, whole
        out.resize(len(tokens), refcheck=False)  # realloc: the byte positions' tail goes back to the system
    return out


def id_counts(tokens: np.ndarray, size: int) -> np.ndarray:
    """How many times each id below ``size`` occurs in ``tokens``, a chunk at a time (``bincount``
    widens its input to 8 bytes an id)."""
    counts = np.zeros(size, dtype=np.int64)
    for start in range(0, len(tokens), ALIGN_CHUNK):
        counts += np.bincount(tokens[start:start + ALIGN_CHUNK], minlength=size)[:size]
    return counts


def _divsufsort_into(data: np.ndarray) -> np.ndarray | None:
    """libdivsufsort over the bytes ``data``, into an int32 array this module owns (so that it can be
    shrunk in place); None where ``pydivsufsort``'s library cannot be reached or the text is too long
    for 32-bit positions."""
    import ctypes
    import importlib

    try:
        library = importlib.import_module("pydivsufsort.divsufsort").libdivsufsort
    except (ImportError, AttributeError):
        return None
    n = len(data)
    if n > np.iinfo(np.int32).max:
        return None
    out = np.empty(n, dtype=np.int32)
    result = library.divsufsort(ctypes.c_void_p(data.ctypes.data), ctypes.c_void_p(out.ctypes.data),
                                ctypes.c_int32(n))
    if result:
        raise RuntimeError(f"libdivsufsort failed ({result}) on {n} bytes")
    return out


def _suffix_array_numpy(tokens: np.ndarray) -> np.ndarray:
    """Prefix doubling with numpy sorts: O(n log^2 n), for when libdivsufsort is missing."""
    n = len(tokens)
    rank = tokens.astype(np.int64)
    k = 1
    sa = np.argsort(rank, kind="stable")
    while True:
        second = np.full(n, -1, dtype=np.int64)
        second[: n - k] = rank[k:]
        sa = np.lexsort((second, rank))
        keys = np.stack([rank[sa], second[sa]])
        new = np.zeros(n, dtype=np.int64)
        new[1:] = np.cumsum(np.any(keys[:, 1:] != keys[:, :-1], axis=0))
        rank = np.empty(n, dtype=np.int64)
        rank[sa] = new
        if new[-1] == n - 1 or k >= n:
            return sa.astype(np.int32 if n < 2**31 else np.int64)
        k *= 2


@dataclass(frozen=True)
class ShardState:
    """A suffix array's state for a matched sequence: its length and its occurrences ``sa[lo:hi]``."""

    length: int
    lo: int
    hi: int


@dataclass
class Counts:
    """What followed the occurrences of a token sequence: distinct next ids, their counts, and the
    number of live occurrences (estimated from an even sample when there are many)."""

    ids: np.ndarray
    counts: np.ndarray
    total: int

    def top(self) -> tuple[int, float]:
        """The most frequent next id and its share (-1, 0 when nothing followed)."""
        if not len(self.ids):
            return -1, 0.0
        best = int(np.argmax(self.counts))
        return int(self.ids[best]), float(self.counts[best] / self.counts.sum())


class SuffixIndex:
    """A suffix array over documents' ids; see the module docstring."""

    def __init__(self, tokens: np.ndarray, sa: np.ndarray, doc_starts: np.ndarray, keys: Sequence[str],
                 first: np.ndarray | None = None) -> None:
        self.tokens = tokens  # [N], documents end to end, each followed by the separator
        self.sa = sa  # [N]
        self.doc_starts = doc_starts  # [D + 1], the last is N
        self.keys = list(keys)  # each document's key (a path)
        self.sep = separator(tokens.dtype)
        self.alive: np.ndarray | None = None  # [N] bool once a document died; None while all live
        self.dead_tokens = 0
        self._doc = {key: i for i, key in enumerate(self.keys)}
        # first[t]: where the suffixes that begin with id t start in the array (one past the last
        # real id: where the separators' suffixes start).
        self.first: np.ndarray | None = first
        if first is None and self.sep <= np.iinfo(np.uint16).max:
            # the array is sorted by first id: the suffixes that begin below t are those of the ids below t
            self.first = np.concatenate(([0], np.cumsum(id_counts(tokens, self.sep + 1))))
        self._shard = _c_shard(tokens, sa)  # the arrays' addresses for the C searches (None: numpy)

    # ---- building -------------------------------------------------------------------------

    @classmethod
    def build(cls, docs: Sequence[tuple[str, np.ndarray]], dtype: np.dtype, *, consume: bool = False) -> SuffixIndex:
        """An index over ``(key, ids)`` documents. ``consume``: ``docs`` (a list) is emptied once its
        ids are laid end to end, so that they are not held under the suffix array (the caller's own
        list of a large build)."""
        sep = separator(dtype)
        lengths = np.asarray([len(ids) + 1 for _, ids in docs], dtype=np.int64)
        starts = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        tokens = np.full(int(starts[-1]), sep, dtype=dtype)
        for (_, ids), start in zip(docs, starts[:-1]):
            tokens[start:start + len(ids)] = ids
        keys = [key for key, _ in docs]
        if consume:
            docs.clear()  # type: ignore[union-attr]
        return cls(tokens, suffix_array(tokens, in_place=True), starts, keys)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.alive is None else self.alive.nbytes
        return int(self.tokens.nbytes + self.sa.nbytes + self.doc_starts.nbytes + extra)

    def has(self, key: str) -> bool:
        return key in self._doc and self.is_alive(key)

    def is_alive(self, key: str) -> bool:
        i = self._doc.get(key)
        if i is None:
            return False
        return self.alive is None or bool(self.alive[self.doc_starts[i]])

    def live_keys(self) -> list[str]:
        return [k for k in self.keys if self.is_alive(k)]

    def document(self, key: str) -> np.ndarray:
        i = self._doc[key]
        return self.tokens[self.doc_starts[i]:self.doc_starts[i + 1] - 1]

    def span(self, key: str) -> tuple[int, int] | None:
        """The positions ``[start, end)`` of a document's ids (its separator not included)."""
        i = self._doc.get(key)
        if i is None:
            return None
        return int(self.doc_starts[i]), int(self.doc_starts[i + 1] - 1)

    def kill(self, key: str) -> bool:
        """Mark a document dead (changed or removed); False when it is not here or already dead."""
        i = self._doc.get(key)
        if i is None or not self.is_alive(key):
            return False
        if self.alive is None:
            self.alive = np.ones(len(self.tokens), dtype=bool)
        start, end = int(self.doc_starts[i]), int(self.doc_starts[i + 1])
        self.alive[start:end] = False
        self.dead_tokens += end - start
        return True

    @property
    def live_tokens(self) -> int:
        return len(self.tokens) - self.dead_tokens

    # ---- saving (the libraries' shard, cached on disk) ---------------------------------------

    def save(self, folder: Path) -> None:
        """Write the shard to ``folder`` (atomically: a temporary folder renamed into place)."""
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
        np.save(tmp / "tokens.npy", self.tokens)
        np.save(tmp / "sa.npy", self.sa)
        np.save(tmp / "doc_starts.npy", self.doc_starts)
        if self.first is not None:
            np.save(tmp / "first.npy", self.first)
        (tmp / "keys.txt").write_text("\n".join(self.keys), encoding="utf-8")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process wrote it first: theirs is the same
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()

    @classmethod
    def load(cls, folder: Path) -> SuffixIndex:
        """A saved shard, memory-mapped (pages are read as queries touch them)."""
        # Plain array views of the maps: numpy.memmap's own indexing costs a Python call per item.
        tokens = np.load(folder / "tokens.npy", mmap_mode="r").view(np.ndarray)
        sa = np.load(folder / "sa.npy", mmap_mode="r").view(np.ndarray)
        starts = np.load(folder / "doc_starts.npy")
        keys = (folder / "keys.txt").read_text(encoding="utf-8").split("\n")
        if len(tokens) != len(sa) or len(starts) != len(keys) + 1 or (len(starts) and starts[-1] != len(tokens)):
            raise ValueError(f"{folder}: the saved index is inconsistent")
        # Where each first id's suffixes start, saved: computing it reads every page of the maps.
        first = np.load(folder / "first.npy") if (folder / "first.npy").is_file() else None
        return cls(tokens, sa, starts, keys, first)

    # ---- queries ----------------------------------------------------------------------------

    def narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """Of the suffixes ``sa[lo:hi]`` (which share their first ``depth`` ids), those whose next
        id is ``token``: a sub-range (empty when none)."""
        if hi <= lo:
            return lo, lo
        if depth == 0 and lo == 0 and hi == len(self.sa) and self.first is not None:
            if token >= len(self.first) - 1:
                return 0, 0
            return int(self.first[token]), int(self.first[token + 1])
        if token > self.sep:
            return lo, lo
        if self._shard is not None:
            return _native.sa_narrow(*self._shard, lo, hi, depth, token)
        tokens, sa = self.tokens, self.sa
        if hi - lo <= SMALL_RANGE:
            column = tokens[sa[lo:hi] + depth]
            typed = column.dtype.type(token)  # searchsorted converts a Python int slowly
            return lo + int(column.searchsorted(typed, side="left")), lo + int(column.searchsorted(typed, side="right"))
        a, b = lo, hi  # first position whose id at depth is >= token
        while a < b:
            mid = (a + b) >> 1
            if tokens[sa[mid] + depth] < token:
                a = mid + 1
            else:
                b = mid
        start = a
        b = hi  # first position whose id at depth is > token
        while a < b:
            mid = (a + b) >> 1
            if tokens[sa[mid] + depth] <= token:
                a = mid + 1
            else:
                b = mid
        return start, a

    def find(self, pattern: Sequence[int], lo: int = 0, hi: int | None = None, depth: int = 0) -> tuple[int, int]:
        """The range of suffixes that begin with ``pattern`` (within ``sa[lo:hi]``, whose suffixes
        share ``pattern[:depth]`` already)."""
        hi = len(self.sa) if hi is None else hi
        n = len(pattern)
        if self._shard is not None and depth < n and hi > lo:
            rest = np.asarray(pattern[depth:], dtype=np.int64)
            if int(rest.max()) > self.sep:  # an id no shard holds
                return lo, lo
            return _native.sa_find(*self._shard, lo, hi, depth, rest.ctypes.data, len(rest))
        tokens, sa = self.tokens, self.sa
        while depth < n and hi > lo:
            if hi - lo <= 4 and n - depth > 1:  # a few candidates: compare the rest whole
                rest = np.asarray(pattern[depth:], dtype=tokens.dtype)
                keep = [i for i in range(lo, hi) if np.array_equal(tokens[sa[i] + depth:sa[i] + n], rest)]
                if not keep:
                    return lo, lo
                return keep[0], keep[-1] + 1  # matches are contiguous
            lo, hi = self.narrow(lo, hi, depth, int(pattern[depth]))
            depth += 1
        return lo, hi

    def continuations(self, lo: int, hi: int, length: int, exclude: tuple[int, int] | None = None,
                      sample: int | None = None) -> np.ndarray:
        """The positions right after the live occurrences ``sa[lo:hi]`` of a ``length``-id sequence,
        those in ``exclude`` (``[start, end)`` positions) left out; at most ``sample`` of them,
        evenly spaced over the range."""
        if sample is not None and hi - lo > sample:
            picks = lo + (np.arange(sample, dtype=np.int64) * (hi - lo)) // sample
            after = self.sa[picks].astype(np.int64) + length
        else:
            after = self.sa[lo:hi].astype(np.int64) + length
        if self.alive is not None:
            after = after[self.alive[after]]
        if exclude is not None:
            after = after[(after < exclude[0]) | (after >= exclude[1])]
        return after

    def _spare(self, exclude: tuple[int, int] | None) -> int:
        """Positions an occurrence could be followed by and not count (dead or excluded): a range
        holding more occurrences than this has a live one."""
        return self.dead_tokens + (exclude[1] - exclude[0] if exclude is not None else 0)

    def any_live(self, lo: int, hi: int, length: int, exclude: tuple[int, int] | None = None) -> bool:
        """Whether some occurrence ``sa[lo:hi]`` is live and not followed by an excluded position."""
        if hi <= lo:
            return False
        spare = self._spare(exclude)
        if hi - lo > spare:
            return True  # more occurrences than positions that could be skipped
        return len(self.continuations(lo, hi, length, exclude)) > 0

    def counts(self, lo: int, hi: int, length: int, exclude: tuple[int, int] | None = None,
               sample: int = SAMPLE) -> Counts:
        """What followed the occurrences ``sa[lo:hi]`` of a ``length``-id sequence."""
        after = self.continuations(lo, hi, length, exclude, sample)
        if not len(after):
            return Counts(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0)
        # The occurrences are sorted by what follows them, so the next ids come out sorted: runs of
        # equal ids are the counts (no sort needed).
        following = self.tokens[after].astype(np.int64)
        following = following[following != self.sep]  # a document's end: nothing followed
        total = len(after) if hi - lo <= sample else round(len(after) * (hi - lo) / sample)
        n = len(following)
        if not n:
            return Counts(following, following, int(total))
        change = np.empty(n + 1, dtype=bool)
        change[0] = change[n] = True
        np.not_equal(following[1:], following[:-1], out=change[1:n])
        edges = np.flatnonzero(change)
        return Counts(following[edges[:-1]], edges[1:] - edges[:-1], int(total))

    # ---- matcher states -----------------------------------------------------------------------

    def root(self) -> ShardState:
        return ShardState(0, 0, len(self.sa))

    def extend(self, state: ShardState, token: int, exclude: tuple[int, int] | None) -> ShardState | None:
        """The state one token on, or None when no live occurrence goes on with it."""
        lo, hi = self.narrow(state.lo, state.hi, state.length, token)
        return ShardState(state.length + 1, lo, hi) if self.any_live(lo, hi, state.length + 1, exclude) else None

    def probe(self, context: Sequence[int], length: int, exclude: tuple[int, int] | None) -> ShardState | None:
        """The state of the last ``length`` ids of ``context``, or None when they have no live occurrence."""
        lo, hi = self.find(context[len(context) - length:])
        return ShardState(length, lo, hi) if self.any_live(lo, hi, length, exclude) else None

    def longest(self, context: Sequence[int], upper: int, exclude: tuple[int, int] | None) -> ShardState:
        """The longest live suffix of ``context``, at most ``upper`` ids (a search over the length: a
        suffix that occurs has every shorter suffix occurring too; galloping up first, since most
        matches are short and a probe costs in its length)."""
        best = self.root()
        if upper <= 0:
            return best
        if self._shard is not None and (self.alive is None or self.alive.flags.c_contiguous):  # in one C call
            rest = np.asarray(context[len(context) - upper:], dtype=np.int64)
            alive = self.alive
            ex_lo, ex_hi = exclude if exclude is not None else (0, 0)
            length, lo, hi = _native.sa_longest(*self._shard, rest.ctypes.data, upper,
                                                0 if alive is None else alive.ctypes.data, ex_lo, ex_hi,
                                                self._spare(exclude))
            return ShardState(length, lo, hi) if length else best
        good, bad = 0, upper + 1
        probe = 1
        while probe < bad:
            state = self.probe(context, probe, exclude)
            if state is None:
                bad = probe
                break
            best, good = state, probe
            probe = min(probe * 2, upper) if probe < upper else bad
        while bad - good > 1:
            mid = (good + bad) // 2
            state = self.probe(context, mid, exclude)
            if state is None:
                bad = mid
            else:
                best, good = state, mid
        return best

    def counts_of(self, state: ShardState, exclude: tuple[int, int] | None) -> Counts:
        return self.counts(state.lo, state.hi, state.length, exclude)


def _c_shard(tokens: np.ndarray, sa: np.ndarray) -> tuple[int, int, int, int, int] | None:
    """``(tokens address, id size, length, suffix array address, its item size)`` for the C searches,
    or None where they cannot read these arrays (no extension, ``GLM5_NATIVE=0``, a layout they do
    not know): numpy then."""
    if _native is None or os.environ.get("GLM5_NATIVE", "1") == "0":
        return None
    if (tokens.ndim != 1 or sa.ndim != 1 or len(tokens) != len(sa) or not tokens.flags.c_contiguous
            or not sa.flags.c_contiguous or tokens.dtype.kind != "u" or tokens.dtype.itemsize not in (1, 2, 4)
            or sa.dtype.kind != "i" or sa.dtype.itemsize not in (4, 8) or not len(tokens)):
        return None
    if not tokens.dtype.isnative or not sa.dtype.isnative:
        return None
    return tokens.ctypes.data, tokens.dtype.itemsize, len(tokens), sa.ctypes.data, sa.dtype.itemsize


@dataclass(frozen=True)
class ScanState:
    """A scanned document's state: the matched length and the positions right after each occurrence
    (None at length 0: every position)."""

    length: int
    ends: np.ndarray | None


SCAN_BLOCK = 256  # positions left after narrowing id by id: then their match lengths at once


class ScanIndex:
    """One document searched by scanning its ids (numpy comparisons over the array), with no suffix
    array to build: the document being edited, re-indexed on every keystroke for the cost of its
    re-tokenized lines alone. Its states keep the positions after each occurrence, so a token on is
    one comparison over those; the longest suffix from scratch is one pass over the document
    (the positions holding the last id, narrowed id by id backwards)."""

    def __init__(self, key: str, ids: np.ndarray) -> None:
        self.keys = [key]
        self.sep = separator(ids.dtype)
        self.tokens = np.empty(len(ids) + 1, dtype=ids.dtype)
        self.tokens[:-1] = ids
        self.tokens[-1] = self.sep
        self.alive_doc = True
        self.dead_tokens = 0
        self.sa = self.tokens  # its length is what callers read as the index's size

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return int(self.tokens.nbytes)

    @property
    def live_tokens(self) -> int:
        return len(self.tokens) - self.dead_tokens

    def has(self, key: str) -> bool:
        return self.alive_doc and key == self.keys[0]

    def is_alive(self, key: str) -> bool:
        return self.has(key)

    def live_keys(self) -> list[str]:
        return list(self.keys) if self.alive_doc else []

    def document(self, key: str) -> np.ndarray:
        return self.tokens[:-1]

    def span(self, key: str) -> tuple[int, int] | None:
        return (0, len(self.tokens) - 1) if key == self.keys[0] else None

    def kill(self, key: str) -> bool:
        if not self.has(key):
            return False
        self.alive_doc = False
        self.dead_tokens = len(self.tokens)
        return True

    # ---- matcher states -----------------------------------------------------------------------

    def root(self) -> ScanState:
        return ScanState(0, None)

    def _live(self, ends: np.ndarray, exclude: tuple[int, int] | None) -> np.ndarray:
        return ends[self._live_mask(ends, exclude)]

    def _live_mask(self, ends: np.ndarray, exclude: tuple[int, int] | None) -> np.ndarray:
        if not self.alive_doc:
            return np.zeros(len(ends), dtype=bool)
        if exclude is None:
            return np.ones(len(ends), dtype=bool)
        return (ends < exclude[0]) | (ends >= exclude[1])

    def extend(self, state: ScanState, token: int, exclude: tuple[int, int] | None) -> ScanState | None:
        tokens = self.tokens
        if state.ends is None:
            ends = np.flatnonzero(tokens == token) + 1
        else:
            ends = state.ends[tokens[state.ends] == token] + 1
        return ScanState(state.length + 1, ends) if len(self._live(ends, exclude)) else None

    def probe(self, context: Sequence[int], length: int, exclude: tuple[int, int] | None) -> ScanState | None:
        state = self._walk(context, length, exclude)
        return state if state.length == length else None

    def longest(self, context: Sequence[int], upper: int, exclude: tuple[int, int] | None) -> ScanState:
        return self._walk(context, upper, exclude)

    def _walk(self, context: Sequence[int], upper: int, exclude: tuple[int, int] | None) -> ScanState:
        """Occurrences of ever longer suffixes of ``context`` (up to ``upper`` ids), read backwards
        from the positions holding its last id; the longest with a live occurrence.

        While many positions remain they are narrowed one id at a time; once at most
        ``SCAN_BLOCK`` do, each one's match length is read in one comparison of the rest of the
        context against the ids before it (a few numpy calls, not a few per id of the match)."""
        best = self.root()
        upper = min(upper, len(context))
        if upper <= 0 or not self.alive_doc:
            return best
        tokens = self.tokens
        ends = np.flatnonzero(tokens == context[-1]) + 1
        length = 1
        while True:
            if not self._live_mask(ends, exclude).any():
                return best
            best = ScanState(length, ends)
            if length == upper:
                return best
            if len(ends) <= SCAN_BLOCK:
                break
            length += 1
            ends = ends[ends - length >= 0]
            ends = ends[tokens[ends - length] == context[-length]]
        # ``ends`` all match ``length`` ids and some are live: how much further each one goes
        offsets = np.arange(length + 1, upper + 1)
        before = ends[:, None] - offsets[None, :]
        wanted = np.asarray(context[len(context) - upper:len(context) - length][::-1], dtype=np.int64)
        same = (before >= 0) & (tokens[np.maximum(before, 0)].astype(np.int64) == wanted[None, :])
        further = np.where(same.all(axis=1), len(offsets), np.argmin(same, axis=1))
        reach = length + further
        longest = int(reach[self._live_mask(ends, exclude)].max())
        return ScanState(longest, ends[reach >= longest])

    def counts_of(self, state: ScanState, exclude: tuple[int, int] | None) -> Counts:
        ends = self._live(state.ends if state.ends is not None else np.arange(len(self.tokens)), exclude)
        following = self.tokens[ends].astype(np.int64)
        following = following[following != self.sep]
        if not len(following):
            return Counts(following, following, len(ends))
        ids, counts = np.unique(following, return_counts=True)
        return Counts(ids, counts.astype(np.int64), len(ends))
