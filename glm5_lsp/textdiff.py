"""The edits between two versions of a text (longest common prefix and suffix), and where an
offset lies in a text (:func:`line_col`).

Both searches compare slices, so the character work runs at C speed (a binary search of about
log2(n) slice comparisons) instead of a Python loop over every character; they work on ``str``,
``bytes`` and lists alike. Used by the context engine and the tree-sitter provider (to re-parse
from an earlier tree), by the server (the edit a fix makes to a document) and by the workspace
memory (the lines of a document that changed).
"""

from __future__ import annotations

from typing import TypeVar

Text = TypeVar("Text", str, bytes, list)


def common_prefix(a: Text, b: Text) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: Text, b: Text, limit: int) -> int:
    """Length of the longest common suffix, at most ``limit`` (pass what the prefix left, so the two never overlap)."""
    lo, hi = 0, max(min(limit, len(a), len(b)), 0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid:] == b[len(b) - mid:]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def line_col(text: Text, offset: int) -> tuple[int, int]:
    """The 0-based line of ``text[offset]`` and its column, counted in the text's own units
    (characters for ``str``, bytes for ``bytes``: tree-sitter's points)."""
    newline = b"\n" if isinstance(text, bytes) else "\n"
    line = text.count(newline, 0, offset)  # type: ignore[arg-type]
    return line, offset - (text.rfind(newline, 0, offset) + 1)  # type: ignore[arg-type]


def diff_region(old: Text, new: Text) -> tuple[int, int, Text]:
    """``(start, end, text)``: the smallest single replacement of ``old[start:end]`` that gives ``new``."""
    start = common_prefix(old, new)
    tail = common_suffix(old, new, min(len(old), len(new)) - start)
    return start, len(old) - tail, new[start : len(new) - tail]


def diff_regions(old: Text, new: Text, max_head_lines: int = 3, min_shared: int = 256) -> list[tuple[int, int, Text]]:
    """One or two replacements, applied in order, that turn ``old`` into ``new``.

    :func:`diff_region` spans everything between the first and the last change, so two edits far
    apart (the cursor jumped: a line restored near the top, another changed near the bottom) make
    one region as long as the text between them, which a parser then re-reads whole. Here, when the
    region's first few lines are followed by at least ``min_shared`` characters both versions share,
    the change is split in two around them: the head (up to ``max_head_lines`` lines of each version)
    and the rest. Offsets of the second edit are in the text the first one produced.
    """
    start, end, middle = diff_region(old, new)
    if start == end == len(old) and not middle:
        return []
    if end - start + len(middle) < 2 * min_shared:
        return [(start, end, middle)]
    before = old[start:end]
    best: tuple[int, int, int] | None = None  # (shared length, old head, new head)
    for old_head in _line_ends(before, max_head_lines):
        for new_head in _line_ends(middle, max_head_lines):
            shared = common_prefix(before[old_head:], middle[new_head:])
            if shared >= min_shared and (best is None or shared > best[0]):
                best = (shared, old_head, new_head)
    if best is None:
        return [(start, end, middle)]
    shared, old_head, new_head = best
    second = start + new_head + shared
    return [(start, start + old_head, middle[:new_head]),
            (second, second + len(before) - old_head - shared, middle[new_head + shared:])]


def _line_ends(text: Text, lines: int) -> list[int]:
    """Offsets just after each of the first ``lines`` line breaks of ``text`` (0 too: an empty head)."""
    ends, at = [0], -1
    newline = b"\n" if isinstance(text, bytes) else "\n"
    for _ in range(lines):
        at = text.find(newline, at + 1)  # type: ignore[arg-type]
        if at < 0:
            break
        ends.append(at + 1)
    return ends
