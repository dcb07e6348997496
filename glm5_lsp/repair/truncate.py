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

LINE_COMMENTS: dict[str, str] = {"python": "#", "ruby": "#", "shell": "#", "r": "#"}
_CLOSERS = {")": "(", "]": "[", "}": "{"}


def cut_points(text: str, language: str = "python", minimum: int = 1) -> list[int]:
    """Lengths at which ``text`` may be cut (longest first), each at least ``minimum`` and short of
    the whole text."""
    comment = LINE_COMMENTS.get(language, "//")
    points: list[int] = []
    opened: list[str] = []  # brackets the candidate itself opened
    quote: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 2
                continue
            if text.startswith(quote, i):
                i += len(quote)
                quote = None
                continue
            if ch == "\n" and len(quote) == 1:
                quote = None  # an unterminated one-line string: the line ends it, badly
            i += 1
            continue
        if text.startswith(comment, i):
            code_end = len(text[:i].rstrip())
            if not opened and minimum <= code_end and text[:i].strip():
                points.append(code_end)  # the code before a trailing comment
            end = text.find("\n", i)
            if end == -1:
                break
            i = end
            continue
        if ch in "\"'`":
            quote = text[i:i + 3] if language == "python" and text.startswith(ch * 3, i) else ch
            i += len(quote)
            continue
        if ch in "([{":
            opened.append(ch)
        elif ch in _CLOSERS:
            if opened and opened[-1] == _CLOSERS[ch]:
                opened.pop()
            elif opened:
                break  # mismatched: nothing after this can be balanced
        i += 1
        word_end = (ch.isalnum() or ch == "_") and (i == len(text) or not (text[i].isalnum() or text[i] == "_"))
        colon = ch == ":" and language == "python"
        if (word_end or colon or ch in _CLOSERS) and not opened and minimum <= i < len(text):
            points.append(i)
    return sorted(set(points), reverse=True)
