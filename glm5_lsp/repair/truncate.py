"""Shorter versions of a candidate that fail the checks: where it may end and still make sense.

A completion that goes wrong half-way (``None, we'`` after ``option_string=No``) often starts
right. Rather than throw it away, the repair loop tries its prefixes that end at a plausible point,
longest first, and keeps one that adds no diagnostic: the editor gets ``None`` at once instead of
nothing, or another generation's worth of waiting.

A plausible end is just after a word (identifier, number, keyword), a closing bracket or (Python) a
block header's colon, or just before a trailing comment, outside any
string or comment the candidate opens, with no bracket the candidate opened left open. Brackets it
closes that the document opened (``ne):``) are fine: they may be what the line needed.
"""

from __future__ import annotations

from glm5_lsp.postprocess import CLOSERS, COMMENT, OPENERS, code_chars


def cut_points(text: str, language: str = "python", minimum: int = 1) -> list[int]:
    """Lengths at which ``text`` may be cut (longest first), each at least ``minimum`` and short of
    the whole text."""
    points: list[int] = []
    opened: list[str] = []  # brackets the candidate itself opened
    for i, ch in code_chars(text, language):
        if ch == COMMENT:
            code_end = len(text[:i].rstrip())
            if not opened and minimum <= code_end and text[:i].strip():
                points.append(code_end)  # the code before a trailing comment
            continue
        if ch in OPENERS:
            opened.append(ch)
        elif ch in CLOSERS:
            if opened and opened[-1] == CLOSERS[ch]:
                opened.pop()
            elif opened:
                break  # mismatched: nothing after this can be balanced
        end = i + 1
        word_end = (ch.isalnum() or ch == "_") and (end == len(text) or not (text[end].isalnum() or text[end] == "_"))
        colon = ch == ":" and language == "python"
        if (word_end or colon or ch in CLOSERS) and not opened and minimum <= end < len(text):
            points.append(end)
    return sorted(set(points), reverse=True)
