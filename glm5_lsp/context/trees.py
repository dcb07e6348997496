"""Parse a text from the closest of the last few trees instead of afresh.

A document changes by a keystroke at a time, and a fresh tree-sitter parse of a 2,600-line file
takes 20-25 ms holding the interpreter lock: :class:`RecentTrees` keeps the last few (text, tree)
pairs, edits the closest tree by the differences (``textdiff.diff_regions``: two regions when the
change's ends lie far apart) and re-parses incrementally from it. The tree-sitter checker and the
syntax questions (``context.syntax``: single or multi-line, empty bodies) each keep one.
"""

from __future__ import annotations

import threading
from collections import deque

from tree_sitter import Parser, Tree

from glm5_lsp.textdiff import common_prefix, common_suffix, diff_regions, line_col


class RecentTrees:
    """The last ``size`` parsed texts per provider; a new text is parsed from the closest one.

    Thread-safe (the runner checks a document and a candidate at once): the lock guards the list
    only; parsing works on a copy of the base tree.
    """

    def __init__(self, size: int = 4, min_shared: float = 0.5) -> None:
        self.entries: deque[tuple[str, bytes, Tree]] = deque(maxlen=max(size, 0))
        self.min_shared = min_shared  # below this share of unchanged bytes, parse afresh
        self.incremental = 0  # parses done from an earlier tree (for tests and logs)
        self._lock = threading.Lock()

    def parse(self, parser: Parser, language: str, source: bytes) -> Tree:
        if self.entries.maxlen == 0:
            return parser.parse(source)
        with self._lock:
            candidates = [(old, tree) for lang, old, tree in self.entries if lang == language]
        best: tuple[int, int, bytes, Tree] | None = None
        for old, tree in candidates:
            if old == source:
                return tree  # the same text: the same tree (trees are never edited in place)
            prefix = common_prefix(old, source)
            suffix = common_suffix(old, source, min(len(old), len(source)) - prefix)
            if best is None or prefix + suffix > best[0] + best[1]:
                best = (prefix, suffix, old, tree)
        edits = diff_regions(best[2], source) if best is not None else []  # two when far apart
        unchanged = len(source) - sum(len(middle) for _, _, middle in edits)
        if best is not None and unchanged >= self.min_shared * len(source):
            _, _, old, base = best
            tree = base.copy()
            for start, end, middle in edits:
                new_end = start + len(middle)
                edited = old[:start] + middle + old[end:]
                tree.edit(start_byte=start, old_end_byte=end, new_end_byte=new_end,
                          start_point=line_col(edited, start), old_end_point=line_col(old, end),
                          new_end_point=line_col(edited, new_end))
                old = edited
            tree = parser.parse(source, tree)
            self.incremental += 1
        else:
            tree = parser.parse(source)
        with self._lock:
            self.entries.append((language, source, tree))
        return tree
