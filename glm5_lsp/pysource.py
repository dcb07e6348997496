"""Python source read as text, without parsing: the one reading of it that every room shares.

While the user types, the line at the cursor is usually broken, so a parser gives up on the whole
file; and a parse of a 2,600-line file costs more than a keystroke allows. These read broken code as
well as whole code, in milliseconds, the same way everywhere:

- :data:`HEADER` / :func:`header`: a ``def`` / ``async def`` / ``class`` header, its name, its
  parameters (or bases) and where the header's colon ends it;
- :func:`blank`: strings become the operand ``0`` and comments vanish, so brackets, names and
  colons in them are not code;
- :func:`logical_lines`: physical lines joined where a bracket or a backslash carries them on, each
  with its indentation and the physical lines it spans;
- :func:`walk_blocks` / :func:`block_tree`: blocks opened by headers and closed by indentation;
- :func:`top_level_cuts` / :func:`top_level_pieces` / :func:`piece`: the file cut where a top-level
  definition (or its first decorator) starts a line. A keystroke changes one piece, so what is worked
  out per piece is kept in one cache (:func:`piece`, then :meth:`Piece.fact`) and a request re-reads
  only what changed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")

# A header at the start of a (logical or physical) line: indentation, ``async``, the kind and the name.
HEADER = re.compile(r"(?P<indent>[ \t]*)(?:async[ \t]+)?(?P<kind>def|class)[ \t]+(?P<name>[A-Za-z_]\w*)")
# A whole header line anywhere in a text (``finditer``): its ``kind`` and ``name`` groups, the line to its end.
HEADER_LINE = re.compile(r"^" + HEADER.pattern + r"[^\n]*", re.MULTILINE)
# What starts a definition's first line (after its indentation): a decorator, ``class``, ``def``, ``async def``.
_DEFINITION_START = r"(?:@|class\b|def\b|async[ \t]+def\b)"

# A string (any prefix, triple or single quotes, possibly unterminated) or a comment.
STRING_OR_COMMENT = re.compile(
    r"""(?<![A-Za-z0-9_])[rRbBuUfF]{0,2}(?:\"\"\"[\s\S]*?(?:\"\"\"|\Z)|'''[\s\S]*?(?:'''|\Z)"""
    r"""|"(?:[^"\\\n]|\\.)*(?:"|$)|'(?:[^'\\\n]|\\.)*(?:'|$))|\#[^\n]*""",
    re.MULTILINE,
)
# A triple-quoted string the text ends inside (its opening quotes, then no closing ones).
_UNTERMINATED = re.compile(r"""[rRbBuUfF]{0,2}(\"\"\"(?![\s\S]*\"\"\"\Z)|'\'\'(?![\s\S]*'\'\'\Z)|\"\"\"\Z|'\'\'\Z)""")
_OPEN = str.maketrans("", "", "([{")
_CLOSE = str.maketrans("", "", ")]}")


class Header(NamedTuple):
    kind: str  # "def" or "class"
    name: str
    params: str  # what the parentheses after the name hold ("" when there are none)
    name_end: int  # offset just past the name
    end: int  # offset just past the header's colon (or the end of the code when it has none yet)


def header(code: str) -> Header | None:
    """The header ``code`` starts with (indentation allowed), or None."""
    match = HEADER.match(code)
    if match is None:
        return None
    at = match.end()
    params = ""
    rest = code[at:]
    stripped = rest.lstrip()
    if stripped.startswith("("):
        open_at = at + len(rest) - len(stripped)
        close_at = _closing(code, open_at)
        params = code[open_at + 1 : close_at]
        at = min(len(code), close_at + 1)
    colon = _colon(code, at)
    return Header(match.group("kind"), match.group("name"), params, match.end(), colon)


def _closing(code: str, open_at: int) -> int:
    """The offset of the bracket closing the one at ``open_at`` (the end of ``code`` if none)."""
    depth = 0
    for i in range(open_at, len(code)):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return len(code)


def _colon(code: str, start: int) -> int:
    """Just past the first colon at bracket depth 0 from ``start`` (a return annotation's brackets skipped)."""
    depth = 0
    for i in range(start, len(code)):
        ch = code[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == ":" and depth <= 0:
            return i + 1
    return len(code)


def blank(text: str) -> str:
    """``text`` with every string replaced by the operand ``0`` (on one line) and every comment removed."""
    return STRING_OR_COMMENT.sub(_blanked, text)


def _blanked(match: re.Match[str]) -> str:
    return "" if match.group(0).startswith("#") else "0"


class LogicalLine(NamedTuple):
    indent: int  # columns (a tab counts to the next multiple of 8)
    code: str  # the physical lines joined by spaces, strings blanked, comments gone, indentation stripped
    first: int  # the 0-based physical lines it spans (a multi-line string's lines included)
    last: int


def logical_lines(text: str) -> list[LogicalLine]:
    """The logical lines of ``text`` (:class:`LogicalLine`). Blank lines are skipped, except the last
    physical line, which is kept even when blank: its indentation is where the cursor stands."""
    return read_lines(text)[0]


def read_lines(text: str) -> tuple[list[LogicalLine], bool]:
    """:func:`logical_lines`, and whether ``text`` ends *closed*: outside any string and bracket, with
    no line continued, so that text after it starts afresh."""
    unterminated = False
    # The blanked text, and for each of its lines the physical lines it covers in ``text`` (a string
    # blanked to ``0`` takes its line breaks with it).
    pieces: list[str] = []
    spans: list[list[int]] = [[0, 0]]
    at = 0
    for match in STRING_OR_COMMENT.finditer(text):
        code = text[at : match.start()]
        pieces.append(code)
        for _ in range(code.count("\n")):
            spans.append([spans[-1][1] + 1, spans[-1][1] + 1])
        token = match.group(0)
        if token.startswith("#"):
            at = match.end()
            continue
        pieces.append("0")
        spans[-1][1] += token.count("\n")
        if match.end() == len(text) and _UNTERMINATED.match(token):
            unterminated = True
        at = match.end()
    tail = text[at:]
    pieces.append(tail)
    for _ in range(tail.count("\n")):
        spans.append([spans[-1][1] + 1, spans[-1][1] + 1])
    physical = "".join(pieces).split("\n")

    out: list[LogicalLine] = []
    depth = 0
    joined: list[str] = []
    indent = first = 0
    open_before_last = False  # a logical line still open where the last physical line begins
    for number, line in enumerate(physical):
        if number == len(physical) - 1:
            open_before_last = bool(joined)
        if not joined:
            stripped = line.lstrip(" \t")
            if not stripped and number < len(physical) - 1:
                continue
            indent = len(line.expandtabs(8)) - len(stripped.expandtabs(8)) if "\t" in line else len(line) - len(stripped)
            first = spans[number][0]
            joined.append(stripped)
        else:
            joined.append(line)
        depth = max(0, depth + (len(line) - len(line.translate(_OPEN))) - (len(line) - len(line.translate(_CLOSE))))
        if depth == 0 and not line.endswith("\\"):
            out.append(LogicalLine(indent, " ".join(joined), first, spans[number][1]))
            joined = []
    # After a final line break the last physical line is empty: whether the text ends open is
    # decided by what came before it (a bracket, a trailing backslash).
    ends_open = open_before_last if physical[-1] == "" else bool(joined)
    if joined:
        out.append(LogicalLine(indent, " ".join(joined), first, spans[-1][1]))
    return out, not ends_open and not unterminated


# ---- blocks -----------------------------------------------------------------------------------


@dataclass(eq=False)
class Block:
    """A ``def`` or ``class`` block: its header and the logical lines it owns (nested blocks apart)."""

    kind: str  # "def" or "class"
    name: str
    indent: int
    params: str  # the header's parentheses ("" when none)
    decorators: list[str]
    header: LogicalLine
    lines: list[LogicalLine] = field(default_factory=list)  # its own lines (a body on the header's line too)
    children: list[Block] = field(default_factory=list)
    parent: Block | None = None
    last: int = -1  # the last physical line of the block (its header's when it has no body yet)

    @property
    def first(self) -> int:
        """The block's first physical line (its header's: decorators are not counted)."""
        return self.header.first


def walk_blocks(
    lines: list[LogicalLine], on_open: Callable[[Block], None] | None = None, stack: list[Block] | None = None
) -> Iterator[tuple[LogicalLine, Header | None, list[Block]]]:
    """Each logical line with its header (or None) and the blocks open around it, innermost last.

    A line of code closes every open block it is not indented under; a blank line (only the last
    physical line is kept blank: the cursor's) closes nothing. A header's block is opened after its
    line is yielded (so the stack yielded with a header holds the blocks around it) and passed to
    ``on_open``. Decorator lines are held for the next header. ``stack``: blocks already open (a walk
    that goes on from where another one stopped); it is updated in place.
    """
    stack = [] if stack is None else stack
    decorators: list[str] = []
    for line in lines:
        if line.code.strip():
            while stack and line.indent <= stack[-1].indent:
                stack.pop()
        found = header(line.code)
        yield line, found, stack
        if line.code.startswith("@"):
            decorators.append(line.code[1:])
            continue
        if found is not None:
            block = Block(found.kind, found.name, line.indent, found.params, decorators, line, last=line.last)
            if stack:
                block.parent = stack[-1]
                stack[-1].children.append(block)
            stack.append(block)
            if line.code[found.end :].strip():  # ``def f(self): return self.x``: a body on the header's line
                block.lines.append(line._replace(code=line.code[found.end :]))
            if on_open is not None:
                on_open(block)
        elif stack and line.code.strip():
            stack[-1].lines.append(line)
            for block in stack:
                block.last = line.last
        decorators = []


def block_tree(lines: list[LogicalLine]) -> list[Block]:
    """The top-level blocks of ``lines``, each with its children (see :func:`walk_blocks`)."""
    top: list[Block] = []
    for _ in walk_blocks(lines, lambda block: top.append(block) if block.parent is None else None):
        pass
    return top


def innermost_block(lines: list[LogicalLine], physical_line: int) -> Block | None:
    """The innermost block whose lines (header to last body line) hold ``physical_line``."""
    best: Block | None = None
    pending = block_tree(lines)
    while pending:
        block = pending.pop()
        if block.first <= physical_line <= max(block.last, block.header.last):
            if best is None or block.first > best.first:
                best = block
            pending.extend(block.children)
    return best


# ---- top-level pieces ---------------------------------------------------------------------------


def definition_starts(text: str, indent: str = "", start: int = 0, end: int | None = None) -> list[int]:
    """Where lines of ``text[start:end]`` that start a definition at exactly ``indent`` begin, after
    ``start``; a decorated definition starts at its first decorator."""
    found = []
    for match in _definition_start(indent).finditer(text, start, len(text) if end is None else end):
        at = match.start()
        if at <= start:
            continue
        if text.startswith(indent + "@", _previous_line(text, at)):
            continue  # a decorated definition (or the next decorator) goes with the decorator above it
        found.append(at)
    return found


@functools.lru_cache(maxsize=16)
def _definition_start(indent: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(indent) + _DEFINITION_START, re.MULTILINE)


def top_level_cuts(text: str) -> list[int]:
    """Where each line that starts a top-level definition begins (:func:`definition_starts` at
    column 0; 0 is never listed)."""
    return definition_starts(text)


def _previous_line(text: str, line_start: int) -> int:
    return text.rfind("\n", 0, line_start - 1) + 1


def top_level_pieces(text: str) -> list[str]:
    """``text`` cut at :func:`top_level_cuts` (every piece but the last ends with a line break)."""
    cuts = top_level_cuts(text)
    if not cuts:
        return [text]
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


class Piece:
    """One top-level piece's text and what has been worked out about it, fact by fact."""

    __slots__ = ("_facts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._facts: dict[Callable[[str], Any], Any] = {}

    def fact(self, compute: Callable[[str], T]) -> T:
        """``compute(self.text)``, worked out once per piece (``compute`` must not change what it returns)."""
        try:
            return self._facts[compute]
        except KeyError:
            value = self._facts[compute] = compute(self.text)
            return value


@functools.lru_cache(maxsize=4096)
def piece(text: str) -> Piece:
    """The one cache of per-piece facts (the names a piece binds, its identifiers, its word counts)."""
    return Piece(text)


# ``from x import *``: a file that has one may use any name.
STAR_IMPORT = re.compile(r"^[ \t]*from[ \t]+[\w.]+[ \t]+import[ \t]+\*", re.MULTILINE)  # ``from x import *``

_TRIPLE = re.compile(r"\"\"\"|\'\'\'")


def open_triple_quote(text: str, start: str | None = None) -> str | None:
    """The triple quote left open at the end of ``text`` (``start``: the one open before it).

    Counts ``\"\"\"`` and ``\'\'\'`` in order, the open kind closing only on its own kind; good
    enough to tell a docstring from code (a triple quote inside a one-line string fools it).
    """
    quote = start
    for match in _TRIPLE.finditer(text):
        if quote is None:
            quote = match.group()
        elif match.group() == quote:
            quote = None
    return quote
