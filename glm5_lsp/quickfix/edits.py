"""What a model-free fix proposes: edits to the text, with a title, before anyone has judged them.

A :class:`Candidate` is one or more :class:`Edit` s (replacements of ``text[start:end]``, applied
together) and a title that says what it does ("Insert missing ':'"). Generators (``parser``,
``ruff``, ``names``) only propose; :mod:`glm5_lsp.quickfix.rank` splices, checks and orders them.

Its *cost* is what the ranking calls the size of the edit: the characters of the user's own code
that change (:func:`word_distance` between the replaced and the new text, so a swapped pair of
letters costs one), with an added line that changes nothing already written (an import) costing
less than any respelling of what the user wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

from glm5_lsp.checks.introduced import Splice

ADDED_LINE_COST = 0.5  # an import added above the code: none of the user's characters change


@dataclass(frozen=True)
class Edit:
    """``text`` in place of ``document[start:end]`` (``start == end``: an insertion)."""

    start: int
    end: int
    text: str

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"bad edit range [{self.start}, {self.end})")


@dataclass
class Candidate:
    """A proposed fix: its edits, what it says it does, and how it ranks among equals."""

    title: str
    edits: tuple[Edit, ...]
    kind: str  # "syntax", "lint", "name", "import", "attribute"
    source: str  # who proposed it: "parser", "tree-sitter", "ruff", "names"
    safe: bool = True  # ruff's applicability; every other generator's fixes are safe
    order: float = 0.0  # the generator's own preference among its candidates (lower first)
    cost: float | None = None  # the size of the edit; None: worked out from the edits
    targets: tuple[int, ...] = field(default_factory=tuple)  # the lines of the diagnostics it answers

    def apply(self, document: str) -> str:
        return self.splice(document).apply()

    def splice(self, document: str) -> Splice:
        """The edits as one replacement of ``document[start:end]`` (from the first edit's start to
        the last one's end), so the introduced-diagnostics judge can map positions through it."""
        edits = sorted(self.edits, key=lambda e: (e.start, e.end))
        if not edits:
            raise ValueError("a candidate without edits")
        for before, after in pairwise(edits):
            if after.start < before.end:
                raise ValueError(f"overlapping edits at {after.start}")
        if edits[-1].end > len(document):
            raise ValueError(f"an edit past the end of the document ({edits[-1].end} > {len(document)})")
        start, end = edits[0].start, edits[-1].end
        pieces, at = [], start
        for edit in edits:
            pieces += [document[at:edit.start], edit.text]
            at = edit.end
        return Splice(document, start, end, "".join(pieces))

    def edit_cost(self, document: str) -> float:
        if self.cost is not None:
            return self.cost
        return float(sum(word_distance(document[e.start:e.end], e.text) for e in self.edits))


def word_distance(a: str, b: str, limit: int = 64) -> int:
    """The optimal-string-alignment distance (insertions, deletions, substitutions and swaps of
    two neighbours, one each) between ``a`` and ``b``; past ``limit`` characters, the longer length."""
    if a == b:
        return 0
    if len(a) > limit or len(b) > limit:
        return max(len(a), len(b))
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        current = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], previous2[j - 2] + 1)
        previous2, previous = previous, current
    return previous[-1]


def insertion(title: str, at: int, text: str, *, kind: str = "syntax", source: str = "parser",
              order: float = 0.0, targets: tuple[int, ...] = ()) -> Candidate:
    return Candidate(title, (Edit(at, at, text),), kind, source, order=order, targets=targets)
