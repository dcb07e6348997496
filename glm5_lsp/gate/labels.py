"""Labels without people: a candidate against the code that was really there.

A cursor is seeded in real code no model here trained on (``glm5_lsp.memory.heldout``: two characters
into an identifier, the rest of the line cut off). The candidate's first line is **exact** when it
equals the real rest of the line (trailing spaces aside), **similar** when their edit similarity is at
least :data:`SIMILAR`; it finishes the **right word** when the identifier it completes is the file's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SIMILAR = 0.8  # the softer label's edit-similarity threshold
_WORD_REST = re.compile(r"[A-Za-z0-9_]*")
_SYMBOLS = re.compile(r"[^\sA-Za-z0-9_]*")


def edit_similarity(a: str, b: str) -> float:
    """1 - Levenshtein distance / the longer length (1.0 for two empty strings)."""
    if not a and not b:
        return 1.0
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return 1 - previous[-1] / len(a)


@dataclass(frozen=True)
class Label:
    shown: bool  # a non-empty first line
    exact: bool
    similarity: float  # 0.0 when nothing is shown
    right_word: bool

    @property
    def similar(self) -> bool:
        return self.shown and self.similarity >= SIMILAR


def first_line(text: str) -> str:
    return text.split("\n", 1)[0].rstrip()


def label(text: str, rest: str, word: str = "", typed: str = "") -> Label:
    """``text`` (what goes in at the cursor) against ``rest`` (the real rest of the line); ``word`` is the
    whole identifier the cursor is in and ``typed`` the part of it before the cursor (after a space,
    ``typed`` is empty and ``word`` may be a symbol run, ``=`` or ``(``, which the text must begin with)."""
    line = first_line(text)
    shown = bool(line.strip())
    finished = typed + _WORD_REST.match(line).group(0)
    if not typed and word and not _WORD_REST.fullmatch(word):
        finished = _SYMBOLS.match(line).group(0)
    return Label(shown=shown, exact=shown and line == rest.rstrip(),
                 similarity=edit_similarity(line, rest.rstrip()) if shown else 0.0,
                 right_word=shown and bool(word) and finished == word)
