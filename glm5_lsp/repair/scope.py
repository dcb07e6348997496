"""Names a Python expression can read at a point of a file, from the text alone.

The decoding monitor keeps the word typed at the cursor to names visible there (``if na`` may become
``name`` if ``name`` is a parameter of the enclosing function, not because another function has a
local ``names``). jedi answers that in 50-900 ms on a 2,600-line file; :func:`names_in_scope` answers
it in a few milliseconds, and a half-typed, broken line does not bother it, because it never parses:

- strings and comments are blanked out (a docstring's words are no names);
- physical lines are joined into logical ones (open brackets, a trailing backslash);
- ``def``/``class`` blocks are followed by indentation;
- every identifier in a block that is not an attribute (``.name``) counts as a name of that block.

Visible at the cursor: the module's names (those of the whole file: a function may call one defined
further down), the names of every enclosing function (parameters and locals), the innermost class
body's names when the cursor is directly in it (Python hides a class body from its methods),
Python's builtins, module attributes (``__name__``...) and keywords (the caller drops those that
cannot start an expression).

It over-counts on purpose: a name merely read somewhere in a block counts as that block's too. For
the monitor a name too many only weakens a mask, while a name too few would forbid a correct
completion; so anything that binds names invisibly (``from x import *``) is the caller's to check.
"""

from __future__ import annotations

import builtins
import functools
import keyword
import re
from dataclasses import dataclass, field

# A string (any prefix, triple or single quotes, possibly unterminated) or a comment.
_STRING_OR_COMMENT = re.compile(
    r"""(?<![A-Za-z0-9_])[rRbBuUfF]{0,2}(?:\"\"\"[\s\S]*?(?:\"\"\"|\Z)|'''[\s\S]*?(?:'''|\Z)"""
    r"""|"(?:[^"\\\n]|\\.)*(?:"|$)|'(?:[^'\\\n]|\\.)*(?:'|$))|\#[^\n]*""",
    re.MULTILINE,
)
_NAME = re.compile(r"(?<![.\w])[A-Za-z_]\w*")
_HEADER = re.compile(r"(?:async\s+)?(def|class)\s+([A-Za-z_]\w*)")
_OPEN = str.maketrans("", "", "([{")
_CLOSE = str.maketrans("", "", ")]}")

# Bound in every module (or class body) without a binding in sight.
MODULE_ATTRIBUTES = frozenset({"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__",
                               "__path__", "__builtins__", "__cached__", "__annotations__", "__dict__",
                               "__class__", "__debug__"})
ALWAYS = frozenset(dir(builtins)) | MODULE_ATTRIBUTES | frozenset(keyword.kwlist)


@dataclass
class _Block:
    indent: int
    kind: str  # "def" or "class"
    names: set[str] = field(default_factory=set)


# A triple-quoted string the text ends inside (its opening quotes, then no closing ones).
_UNTERMINATED = re.compile(r"""[rRbBuUfF]{0,2}(\"\"\"(?![\s\S]*\"\"\"\Z)|'\'\'(?![\s\S]*'\'\'\Z)|\"\"\"\Z|'\'\'\Z)""")
# Where a top-level ``def``, ``class`` or decorator starts a line: the file is read in pieces cut there.
_TOP_LEVEL = re.compile(r"^(?=(?:async[ \t]+)?def[ \t]|class[ \t]|@)", re.MULTILINE)


def _blank(match: re.Match[str]) -> str:
    return "" if match.group(0).startswith("#") else "0"  # a string stays an operand, on one line


def logical_lines(text: str) -> list[tuple[int, str]]:
    """``(indentation, code)`` for each logical line of ``text``, strings and comments blanked out.

    The last physical line is kept even when blank: its indentation is where the cursor stands."""
    return _logical_lines(text)[0]


def _logical_lines(text: str) -> tuple[list[tuple[int, str]], bool]:
    """:func:`logical_lines`, and whether ``text`` ends closed: outside any string and bracket, with
    no line continued (the next text then starts afresh)."""
    unterminated = False

    def blank(match: re.Match[str]) -> str:
        nonlocal unterminated
        if match.end() == len(text) and _UNTERMINATED.match(match.group(0)):
            unterminated = True
        return _blank(match)

    code = _STRING_OR_COMMENT.sub(blank, text)
    out: list[tuple[int, str]] = []
    depth = 0
    joined: list[str] = []
    indent = 0
    physical = code.split("\n")
    open_before_last = False  # a logical line still open where the last physical line begins
    for number, line in enumerate(physical):
        if number == len(physical) - 1:
            open_before_last = bool(joined)
        if not joined:
            stripped = line.lstrip(" \t")
            if not stripped and number < len(physical) - 1:
                continue
            indent = len(line.expandtabs(8)) - len(stripped.expandtabs(8)) if "\t" in line else len(line) - len(stripped)
            joined.append(stripped)
        else:
            joined.append(line)
        depth = max(0, depth + (len(line) - len(line.translate(_OPEN))) - (len(line) - len(line.translate(_CLOSE))))
        if depth == 0 and not line.endswith("\\"):
            out.append((indent, " ".join(joined)))
            joined = []
    # After a final line break the last physical line is empty: whether the text ends open is
    # decided by what came before it (a bracket, a trailing backslash).
    ends_open = open_before_last if physical[-1] == "" else bool(joined)
    if joined:
        out.append((indent, " ".join(joined)))
    return out, not ends_open and not unterminated


def _scan(lines: list[tuple[int, str]], blocks: list[_Block], module: set[str], *, collect: bool = True) -> None:
    """Walk ``lines``, opening and closing blocks; names go to the innermost open block (or the
    module). With ``collect`` false only the module's names are gathered."""
    for indent, code in lines:
        while blocks and indent <= blocks[-1].indent:
            blocks.pop()
        names = blocks[-1].names if blocks else module
        header = _HEADER.match(code)
        if header is not None:
            kind, name = header.groups()
            if collect or not blocks:
                names.add(name)
            own = set(_NAME.findall(code, header.end())) if kind == "def" and collect else set()
            blocks.append(_Block(indent, kind, own))
        elif collect or not blocks:
            names.update(_NAME.findall(code))


def names_in_scope(before: str, after: str = "") -> set[str]:
    """The names visible at the end of ``before`` (the file up to the cursor, without the word being
    typed there); ``after`` is the rest of the file, read for its module-level names only."""
    return set(scope_at(before, after)[0])


def top_level_pieces(text: str) -> list[str]:
    """``text`` cut at the start of every line that opens a top-level ``def``, ``class`` or
    decorator (every piece but the last ends with a line break). Keystrokes change one piece, so
    what is worked out per piece can be kept across requests."""
    cuts = [m.start() for m in _TOP_LEVEL.finditer(text) if m.start()]
    if not cuts:
        return [text]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


MERGED_PIECES = 3  # pieces read together before the rest of an unclosed text is read in one go


@dataclass(frozen=True)
class _Piece:
    closed: bool  # it ends outside strings and brackets: the next piece starts afresh
    module: frozenset[str]  # the names its module-level code binds or reads


@functools.lru_cache(maxsize=2048)
def _piece(text: str) -> _Piece:
    lines, closed = _logical_lines(text)
    module: set[str] = set()
    _scan(lines, [], module, collect=False)
    return _Piece(closed, frozenset(module))


@functools.lru_cache(maxsize=4)
def scope_at(before: str, after: str = "") -> tuple[frozenset[str], str]:
    """:func:`names_in_scope` and the kind of the innermost block at the cursor: ``"def"``,
    ``"class"`` (directly in a class body) or ``"module"``. The last few answers are kept: the
    decoding monitor and the word finisher of one request ask about the same cursor.

    The code before the top-level statement the cursor is in contributes its module-level names
    only; those are worked out per :func:`top_level_pieces` piece and kept, so a request re-reads
    the piece it edits and the cursor's own. A piece that ends inside a string or a bracket is read
    together with the next one, which makes the answer the same as reading the text in one go."""
    blocks: list[_Block] = []
    module: set[str] = set()
    pieces = top_level_pieces(before)
    pending = _module_names(pieces[:-1], module)
    lines = logical_lines(pending + pieces[-1])
    if lines:  # the cursor's own line closes the blocks it is not inside
        *body, (indent, code) = lines
        _scan(body, blocks, module)
        _scan([(indent, "")], blocks, module)
        (blocks[-1].names if blocks else module).update(_NAME.findall(code))
    visible = set(module)
    for block in blocks:
        if block.kind == "def" or block is blocks[-1]:
            visible |= block.names
    innermost = blocks[-1].kind if blocks else "module"
    newline = after.find("\n")
    if newline != -1:
        # The rest of the cursor's top-level statement is read with its blocks still open (their
        # names are not the module's); the pieces after it start afresh.
        rest = top_level_pieces(after[newline + 1:])
        count = 1
        lines, closed = _logical_lines(rest[0])
        while not closed and count < len(rest):
            count = count + 1 if count < MERGED_PIECES else len(rest)  # broken code: read the rest at once
            lines, closed = _logical_lines("".join(rest[:count]))
        _scan(lines, blocks, module, collect=False)
        tail = _module_names(rest[count:], module)
        if tail:
            module |= _piece(tail).module
        visible |= module
    return frozenset(visible | ALWAYS), innermost


def _module_names(pieces: list[str], module: set[str]) -> str:
    """Add the module-level names of consecutive ``pieces`` to ``module`` (kept per piece); returns
    the trailing text that does not end closed (to be read with what follows it)."""
    pending = ""
    merged = 0
    for number, piece in enumerate(pieces):
        pending += piece
        known = _piece(pending)
        if known.closed:
            module |= known.module
            pending, merged = "", 0
            continue
        merged += 1
        if merged >= MERGED_PIECES:  # broken code (an unclosed string or bracket): the rest in one go
            return pending + "".join(pieces[number + 1:])
    return pending
