"""The one edit between two versions of a text: longest common prefix and suffix.

Both searches compare slices, so the character work runs at C speed (a binary search of about
log2(n) slice comparisons) instead of a Python loop over every character; they work on ``str`` and
``bytes`` alike. Used by the context engine and the tree-sitter provider (to re-parse from an
earlier tree) and by the server (the edit a fix makes to a document).
"""

from __future__ import annotations

from typing import TypeVar

Text = TypeVar("Text", str, bytes)


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


def diff_region(old: Text, new: Text) -> tuple[int, int, Text]:
    """``(start, end, text)``: the smallest single replacement of ``old[start:end]`` that gives ``new``."""
    start = common_prefix(old, new)
    tail = common_suffix(old, new, min(len(old), len(new)) - start)
    return start, len(old) - tail, new[start : len(new) - tail]
