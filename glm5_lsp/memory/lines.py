"""The workspace's lines, for the rest of the line the cursor is on: how the project's other lines
that start as the typed one does go on.

A line-level view of the workspace beside the token-level suffix index: a project writes the same
line again and again (``from .compat import ...``, ``self.assertEqual(``, ``@overload``), and the
most frequent way its other lines go on from the typed text (indentation aside) is a strong guess
on its own. Where it and the token memory's continuation agree, the two are right most of the time
(``pipeline.memory``; BENCHMARKS.md, "Workspace memory").

:class:`LineIndex` counts each distinct stripped line of the workspace's documents (the libraries
are left out: another project's lines are another style). Queries find the lines that start with a
prefix in a sorted list of the distinct lines (bisection), plus a short list of lines added since it
was sorted (scanned); an edit changes only the counts of the lines it touched.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass

from glm5_lsp.textdiff import common_prefix, common_suffix

MAX_SCAN = 20_000  # distinct lines looked at for one query (a one-letter prefix in a large workspace)
RESORT_AFTER = 4_096  # new distinct lines kept unsorted before the list is sorted again


@dataclass(frozen=True)
class LineGuess:
    """The most frequent rest among the workspace's lines that start with the typed text."""

    rest: str  # what follows the typed text on those lines (trailing spaces cut)
    count: int  # lines that go on that way
    total: int  # lines that start with the typed text (and go on)
    distinct: int  # different rests among them

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0


def _stripped(line: str) -> str:
    return line.strip(" \t\r\f\v")


class LineIndex:
    """See the module docstring. Keys are documents' keys (``memory.as_key``). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._lines: dict[str, list[str]] = {}  # each document's stripped, non-empty lines
        self._sorted: list[str] = []
        self._extra: set[str] = set()  # counted, not yet in ``_sorted``

    def __len__(self) -> int:
        return len(self._lines)

    def __contains__(self, key: str) -> bool:
        return key in self._lines

    def set(self, key: str, text: str) -> None:
        """Document ``key`` now reads ``text``: only the lines between the unchanged head and tail
        are counted again (a keystroke touches one)."""
        new = [s for s in map(_stripped, text.split("\n")) if s]
        with self._lock:
            old = self._lines.get(key, [])
            head = common_prefix(old, new)
            tail = common_suffix(old, new, min(len(old), len(new)) - head)
            self._take(old[head:len(old) - tail])
            self._add(new[head:len(new) - tail])
            self._lines[key] = new

    def remove(self, key: str) -> bool:
        with self._lock:
            old = self._lines.pop(key, None)
            if old is None:
                return False
            self._take(old)
            return True

    def rename(self, old: str, new: str) -> None:
        with self._lock:
            if old in self._lines:
                self._lines[new] = self._lines.pop(old)

    def _take(self, lines: list[str]) -> None:
        for line in lines:
            left = self._counts[line] - 1
            if left > 0:
                self._counts[line] = left
            else:
                del self._counts[line]  # its place in ``_sorted`` is skipped until the next sort

    def _add(self, lines: list[str]) -> None:
        for line in lines:
            if line not in self._counts:
                self._extra.add(line)
            self._counts[line] += 1
        if len(self._extra) > RESORT_AFTER:
            self._resort()

    def _resort(self) -> None:
        self._sorted = sorted(self._counts)
        self._extra = set()

    def guess(self, typed: str, *, key: str | None = None, line: str | None = None) -> LineGuess | None:
        """The most frequent rest of the lines that start with ``typed`` (the cursor's line before the
        cursor; its indentation is ignored), or None when no line does; where document ``key``'s own
        lines go on from it, the most frequent of theirs. ``line``, the cursor's whole line as
        document ``key`` holds it now, is not counted (it is the line being written)."""
        prefix = typed.lstrip(" \t")  # what was typed after the indentation, a trailing space included
        if not prefix.strip():
            return None
        own = _stripped(line) if line is not None and key in self._lines else None
        rests: Counter[str] = Counter()
        with self._lock:
            if len(self._extra) > RESORT_AFTER // 4 and len(self._extra) * 8 > len(self._sorted):
                self._resort()
            start = bisect.bisect_left(self._sorted, prefix)
            matching = set()
            for text in self._sorted[start:start + MAX_SCAN]:
                if not text.startswith(prefix):
                    break  # sorted: no later line starts with it
                matching.add(text)
            # a line gone (count 0) and back again is in both
            matching.update(text for text in self._extra if text.startswith(prefix))
            for text in matching:
                count = self._counts.get(text, 0) - (text == own)
                rest = text[len(prefix):].rstrip()
                if count > 0 and rest:
                    rests[rest] += count
            document = self._lines.get(key, []) if key is not None else []
            mine = Counter(text[len(prefix):].rstrip() for text in document if text.startswith(prefix))
        if own is not None and own.startswith(prefix):  # the line being written
            mine[own[len(prefix):].rstrip()] -= 1
        mine = Counter({rest: n for rest, n in mine.items() if n > 0 and rest})
        if not rests:
            return None
        # The document's own lines first (ties broken by the workspace's counts), as the memory's
        # matches are: on FIT's 312 cursors the copy baseline so was exact 14.4% against 13.8%
        # (BENCHMARKS.md, "The document's own continuation first"). The count and total stay the
        # workspace's: how settled the line is there.
        pool = mine or rests
        best = min(pool, key=lambda rest: (-pool[rest], -rests[rest], rest))
        return LineGuess(best, rests[best], sum(rests.values()), len(rests))
