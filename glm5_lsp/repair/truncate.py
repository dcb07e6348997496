"""Shorter versions of a candidate that fail the checks: where it may end and still make sense.

A completion that goes wrong half-way (``None, we'`` after ``option_string=No``) often starts
right. Rather than throw it away, the repair loop tries its prefixes that end at a plausible point,
longest first, and keeps one that adds no diagnostic: the editor gets ``None`` at once instead of
nothing, or another generation's worth of waiting.

A plausible end is just after a word (identifier, number, keyword), a closing bracket or (Python) a
block header's colon, or just before a trailing comment, outside any
string or comment the candidate opens, with no bracket the candidate opened left open. Brackets it
closes that the document opened (``ne):``) are fine: they may be what the line needed.

An answer that ends a block header (``if " " in va|`` -> ``lue``, the word finished) leaves the line
without its colon, and the checks cannot tell: the document already lacked it, so nothing is
*introduced*. :func:`header_colon` gives such a text its colon where the lines below show the
block's body. A cut gets none: the model meant the header to go on (``if x`` + `` in xs:``).
"""

from __future__ import annotations

import builtins
import re

from glm5_lsp.postprocess import CLOSERS, COMMENT, OPENERS, code_chars, ends_in_code
from glm5_lsp.pysource import blank

# The compound statements whose header ends in a colon: those that take an expression after the
# keyword, and those that are the keyword alone.
_HEADER_WITH_EXPRESSION = re.compile(r"(?:async\s+)?(?:if|elif|while|for|with|def|class)\s+\S|except\b")
_HEADER_ALONE = re.compile(r"(?:else|try|finally)\s*")
# Headers whose expression rarely ends in a bare function or class (``for i in enumerate``,
# ``if isinstance``): such a word is most likely called next, and its colon would be wrong.
_CONDITION_OR_LOOP = re.compile(r"(?:async\s+)?(?:if|elif|while|for)\b")
_LAST_WORD = re.compile(r"([A-Za-z_]\w*)\Z")


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


def header_colon(text: str, document: str, start: int, end: int, language: str = "python") -> str | None:
    """``text`` with the colon its line needs when, put in ``document[start:end]``, it ends a block
    header that has none (a compound statement's keyword first, whole: it compiles with the colon;
    nothing after it on the line) and the next non-blank line is indented deeper: its body. None
    otherwise, and after a name most likely called next (``for i in enumerate``)."""
    if language != "python" or not text.strip() or "\n" in text:
        return None
    line_start = document.rfind("\n", 0, start) + 1
    line_end = document.find("\n", end)
    line_end = len(document) if line_end < 0 else line_end
    if document[end:line_end].strip():
        return None  # the line goes on after the cursor: its own end may hold the colon
    line = document[line_start:start] + text
    code = blank(line).rstrip()
    stripped = code.lstrip()
    if not ends_in_code(line, language):
        return None  # the line ends in a comment or a string: the colon would go into it
    if not (_HEADER_WITH_EXPRESSION.match(stripped) or _HEADER_ALONE.fullmatch(stripped)):
        return None
    if not _compiles(line.strip() + ":"):
        return None  # not a whole header: cut mid-expression (``if x in``), in a string, an earlier line's bracket
    last = _LAST_WORD.search(code)
    if last and _CONDITION_OR_LOOP.match(stripped) and _callable_name(last.group(1), document):
        return None
    indent = len(line.expandtabs(8)) - len(line.expandtabs(8).lstrip())
    for below in document[line_end + 1:].split("\n"):
        if below.strip():
            body = below.expandtabs(8)
            return text.rstrip() + ":" if len(body) - len(body.lstrip()) > indent else None
    return None


def _callable_name(word: str, document: str) -> bool:
    """Whether ``word`` names a builtin function or class, or one the document defines."""
    if callable(getattr(builtins, word, None)):
        return True
    return re.search(rf"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+{re.escape(word)}\b", document, re.MULTILINE) is not None


def _compiles(header: str) -> bool:
    """Whether ``header`` (one line, its colon included) is a complete compound statement's header:
    it compiles with a body, after an ``if`` or ``try`` where it continues one, inside an ``async def``
    (so ``async for`` and ``await`` are allowed)."""
    before = ""
    if re.match(r"(?:elif|else)\b", header):
        before = " if 0:\n  pass\n"
    elif re.match(r"(?:except|finally)\b", header):
        before = " try:\n  pass\n"
    try:
        compile(f"async def _header():\n{before} {header}\n  pass\n", "<header>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True
