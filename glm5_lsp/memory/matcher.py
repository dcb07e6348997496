"""The longest suffix of a growing context found in the memory, one token at a time.

For each shard the matcher keeps the longest suffix of the context that occurs there (live, outside
the excluded range) and the range of the suffix array holding its occurrences. A new token either
extends it (the occurrences narrowed by one id: a binary search) or, when no occurrence goes on with
that token, the longest suffix is looked for again, no longer than before (a binary search over the
length). Over all shards the longest wins and the counts of what followed it are summed over the
shards that have it, as infini-gram's estimate does, except that the request's own document, where
it has that longest match, decides and the other shards only break its ties (``Source.own``).

The context is the prompt's code (bound once per request) plus the tokens generated since. The
states are kept as a tree of the token sequences followed since the prompt: going back to a
sequence followed before (a draft's tokens, then the same text with its last piece tokenized
another way, then the draft again) costs no search (:meth:`Matcher.sync`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from glm5_lsp.memory.index import Counts, ScanIndex, ShardState, SuffixIndex  # noqa: F401

MAX_MATCH = 256  # tokens: a longer suffix adds nothing to the estimate and costs in the search
OWN_WEIGHT = 1024  # one count of the request's own document against all of the other shards' counts


@dataclass(frozen=True)
class Source:
    """One shard as a request sees it: the positions ``exclude`` (``[start, end)``) never count as
    what followed a match (the cursor's own line in the document being edited). ``own``: the shard is
    the request's own document; where it holds the longest match, what followed there decides the
    estimate and the other shards' occurrences of that match only break its ties."""

    index: SuffixIndex | ScanIndex
    exclude: tuple[int, int] | None = None
    own: bool = False


@dataclass
class Match:
    """The memory's estimate after a context: the longest suffix found (``length`` ids, 0 for none)
    and what followed its occurrences."""

    length: int
    counts: Counts
    shards: tuple[Any, ...] = field(repr=False, default=())

    @property
    def total(self) -> int:
        return self.counts.total

    def top(self) -> tuple[int, float]:
        return self.counts.top()

    def probabilities(self) -> tuple[np.ndarray, np.ndarray]:
        """Next ids and their probabilities under the memory alone."""
        counts = self.counts.counts
        total = counts.sum()
        if not total:
            return self.counts.ids, counts.astype(np.float64)
        return self.counts.ids, counts / total


def _common_prefix(known: list[int], base: int, ids: Sequence[int]) -> int:
    """How many leading ``ids`` equal ``known[base:]`` (slice comparisons: C speed, then a binary
    search only where they differ)."""
    ids = ids if isinstance(ids, list) else [int(t) for t in ids]
    limit = min(len(ids), len(known) - base)
    if known[base:base + limit] == ids[:limit]:
        return limit
    lo, hi = 0, limit  # known[base:base+lo] == ids[:lo]; they differ within [:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if known[base:base + mid] == ids[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


_EMPTY = Counts(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 0)
MAX_NODES = 50_000  # states kept off the current path before the tree is pruned back to it


class _Node:
    """The shards' states after one token sequence, the estimate from them (computed when asked),
    the estimates from shorter suffixes (:meth:`Matcher.backoff`) and the sequences one token on."""

    __slots__ = ("backoffs", "children", "match", "states")

    def __init__(self, states: tuple[Any, ...]) -> None:
        self.states = states
        self.match: Match | None = None
        self.backoffs: dict[int, Match] = {}
        self.children: dict[int, _Node] = {}


class Matcher:
    """Longest-suffix states for one request's context over a fixed set of shards."""

    def __init__(self, sources: Sequence[Source], max_match: int = MAX_MATCH) -> None:
        self.sources = [s for s in sources if len(s.index)]
        self.max_match = max_match
        self.context: list[int] = []
        self._path: list[_Node] = []  # the nodes after context[: base + i]
        self._base = 0
        self._nodes = 0  # made since the tree was last pruned

    # ---- following a context ----------------------------------------------------------------

    def bind(self, context: Sequence[int]) -> Match:
        """Start over with ``context`` (the prompt's code); later calls extend it."""
        self.context = [int(t) for t in context]
        self._base = len(self.context)
        self._path = [_Node(tuple(self._longest(source, self.context, self.max_match) for source in self.sources))]
        self._nodes = 0
        return self.match_at(0)

    def sync(self, generated: Sequence[int]) -> Match:
        """The estimate after the bound context plus ``generated``."""
        base = self._base
        known = self.context
        n = _common_prefix(known, base, generated)
        if n < len(generated) or base + n < len(known):  # elsewhere: the path follows ``generated`` (the
            del known[base + n:]  # tree keeps what it leaves, found again by ``push``)
            del self._path[n + 1:]
            for token in generated[n:]:
                self.push(int(token))
        return self.match_at(len(generated))

    def push(self, token: int) -> Match:
        """Append one token to the context (past every state on the current path)."""
        self.context.append(token)
        node = self._path[-1]
        child = node.children.get(token)
        if child is None:
            if self._nodes >= MAX_NODES:
                self._prune()
                node = self._path[-1]
            child = _Node(tuple(self._extend(source, state, token) for source, state in zip(self.sources, node.states)))
            node.children[token] = child
            self._nodes += 1
        self._path.append(child)
        return self.match_at(len(self._path) - 1)

    def _prune(self) -> None:
        """Forget the states off the current path (a long request's tree stays bounded)."""
        for node, after in zip(self._path, self._path[1:]):
            token = next(t for t, c in node.children.items() if c is after)
            node.children = {token: after}
        self._path[-1].children = {}
        self._nodes = 0

    def match_at(self, i: int) -> Match:
        """The estimate after ``context[: base + i]``."""
        node = self._path[i]
        if node.match is None:
            node.match = self._estimate(node.states)
        return node.match

    @property
    def generated(self) -> list[int]:
        return self.context[self._base:]

    def continuation(self, generated: Sequence[int], max_tokens: int, min_length: int = 1,
                     min_share: float = 0.0, stop: Sequence[int] = ()) -> list[int]:
        """The memory's own greedy continuation after ``generated``: the most frequent next id,
        again and again, while the match is at least ``min_length`` ids long and that id at least
        ``min_share`` of what followed; it ends after an id in ``stop``. The states it walks are
        kept (a draft verified next costs no new search)."""
        match = self.sync(generated)
        out: list[int] = []
        i = len(generated)
        while len(out) < max_tokens:
            token, share = match.top()
            if token < 0 or match.length < min_length or share < min_share:
                break
            out.append(token)
            i += 1
            del self.context[self._base + i - 1:]
            del self._path[i:]
            match = self.push(token)
            if token in stop:
                break
        return out

    def backoff(self, generated: Sequence[int], length: int) -> Match:
        """The estimate from the suffix of ``length`` ids (shorter than the longest) after the
        bound context plus ``generated``: what followed it wherever it occurs."""
        self.sync(generated)
        node = self._path[len(generated)]
        found = node.backoffs.get(length)
        if found is None:
            context = self.context
            states = []
            for source in self.sources:
                state = self._probe(source, context, length) if length <= len(context) else None
                states.append(state if state is not None else source.index.root())
            found = node.backoffs[length] = self._estimate(tuple(states))
        return found

    # ---- per shard ------------------------------------------------------------------------------

    def _extend(self, source: Source, state: Any, token: int) -> Any:
        index = source.index
        if state.length < self.max_match:
            found = index.extend(state, token, source.exclude)
            if found is not None:
                return found
        else:  # at the cap: the same length, one token on (most often still there)
            found = self._probe(source, self.context, self.max_match)
            if found is not None:
                return found
        return self._longest(source, self.context, min(state.length, self.max_match))

    @staticmethod
    def _longest(source: Source, context: Sequence[int], upper: int) -> Any:
        return source.index.longest(context, min(upper, len(context)), source.exclude)

    @staticmethod
    def _probe(source: Source, context: Sequence[int], length: int) -> Any:
        return source.index.probe(context, length, source.exclude)

    def _estimate(self, states: tuple[Any, ...]) -> Match:
        length = max((s.length for s in states), default=0)
        if length == 0:
            return Match(0, _EMPTY, states)
        found = [(source.own, source.index.counts_of(s, source.exclude))
                 for source, s in zip(self.sources, states) if s.length == length]
        if len(found) == 1:
            return Match(length, found[0][1], states)
        # The document's own continuation first: where it has the longest match, its counts decide
        # and the other shards' only break its ties (each of its counts weighs 1,024 times all of
        # theirs together, so its shares stand within 0.1%); the total stays the number of
        # occurrences. On FIT's 312 cursors the memory's greedy line was the file's 65 times this
        # way, 63 with the counts summed (BENCHMARKS.md, "The document's own continuation first").
        own = any(is_own and len(counts.ids) for is_own, counts in found)
        scale = OWN_WEIGHT * (1 + sum(int(counts.counts.sum()) for is_own, counts in found if not is_own)) if own else 1
        ids = np.concatenate([counts.ids for _, counts in found])
        weights = np.concatenate([counts.counts * (scale if is_own else 1) for is_own, counts in found])
        merged, where = np.unique(ids, return_inverse=True)
        summed = np.zeros(len(merged), dtype=np.int64)
        np.add.at(summed, where, weights)
        return Match(length, Counts(merged, summed, sum(counts.total for _, counts in found)), states)
