"""The word being typed, finished from the names around it: the answer when nothing generated is clean.

At the start of a statement the small default model often writes a line that no check passes
(``im`` -> ``import numpy as a copy of the same.``), and an as-you-type completion then has nothing to
show although the user has typed half a word whose end is plain to see: ``return``, a name used a few
lines up. :func:`finishing_words` lists the words that finish it, likeliest first; the repair loop
judges them like any candidate (spliced in, nothing new may break) and returns the first clean one.

Candidates are the names visible at the cursor for Python (:func:`~glm5_lsp.repair.scope.scope_at`:
the enclosing functions' names, the module's, builtins and keywords), the document's identifiers for
other languages. They are ranked by how often they occur near the cursor (within ``NEAR`` characters),
then in the whole document, then by length: what the code around the cursor keeps using is the likeliest
next word, as in the plain word completers editors have long had.
"""

from __future__ import annotations

import re
from collections import Counter

from glm5_lsp.repair.scope import scope_at

NEAR = 3000  # characters on each side of the cursor counted as "near"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def finishing_words(before: str, typed: str, after: str, language: str, limit: int = 3) -> list[str]:
    """At most ``limit`` words that begin with ``typed`` (and are longer), likeliest first.

    ``before`` is the document up to the typed word, ``after`` the document after the cursor."""
    if not typed or not _IDENT.fullmatch(typed):
        return []
    if language == "python":
        pool = scope_at(before, after)[0]
    else:
        pool = set(_IDENT.findall(before)) | set(_IDENT.findall(after))
    words = [w for w in pool if w.startswith(typed) and w != typed]
    if not words:
        return []
    near = Counter(_IDENT.findall(before[-NEAR:] + " " + after[:NEAR]))
    total = Counter(_IDENT.findall(before)) + Counter(_IDENT.findall(after))
    words.sort(key=lambda w: (-near[w], -total[w], len(w), w))
    return words[:limit]
