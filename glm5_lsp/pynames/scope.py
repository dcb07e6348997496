"""Names a Python expression can read at a point of a file, from the text alone.

The decoding monitor keeps the word typed at the cursor to names visible there (``if na`` may become
``name`` if ``name`` is a parameter of the enclosing function, not because another function has a
local ``names``). jedi answers that in 50-900 ms on a 2,600-line file; :func:`names_in_scope` answers
it in a few milliseconds, and a half-typed, broken line does not bother it, because it never parses:

- strings and comments are blanked out (a docstring's words are no names), physical lines are
  joined into logical ones (open brackets, a trailing backslash) and ``def``/``class`` blocks are
  followed by indentation, all by :mod:`glm5_lsp.pysource`;
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
from dataclasses import dataclass

from glm5_lsp.pysource import Block, LogicalLine, header, piece, read_lines, top_level_pieces, walk_blocks

_NAME = re.compile(r"(?<![.\w])[A-Za-z_]\w*")

# Bound in every module (or class body) without a binding in sight.
MODULE_ATTRIBUTES = frozenset({"__file__", "__name__", "__doc__", "__spec__", "__loader__", "__package__",
                               "__path__", "__builtins__", "__cached__", "__annotations__", "__dict__",
                               "__class__", "__debug__"})
ALWAYS = frozenset(dir(builtins)) | MODULE_ATTRIBUTES | frozenset(keyword.kwlist)


def _scan(lines: list[LogicalLine], stack: list[Block], names: dict[Block, set[str]], module: set[str], *,
          collect: bool = True) -> None:
    """Walk ``lines`` with the blocks of ``stack`` open (updated in place); names go to the innermost
    open block (``names``) or the module. With ``collect`` false only the module's names are gathered."""

    def opened(block: Block) -> None:  # a function's own names start with its parameters and annotations
        found = header(block.header.code) if collect and block.kind == "def" else None
        names[block] = set(_NAME.findall(block.header.code, found.name_end)) if found else set()

    for line, found, open_blocks in walk_blocks(lines, opened, stack):
        inner = names.setdefault(open_blocks[-1], set()) if open_blocks else module
        if found is not None:
            if collect or not open_blocks:
                inner.add(found.name)
        elif collect or not open_blocks:
            inner.update(_NAME.findall(line.code))


def names_in_scope(before: str, after: str = "") -> set[str]:
    """The names visible at the end of ``before`` (the file up to the cursor, without the word being
    typed there); ``after`` is the rest of the file, read for its module-level names only."""
    return set(scope_at(before, after)[0])


MERGED_PIECES = 3  # pieces read together before the rest of an unclosed text is read in one go


@dataclass(frozen=True)
class _PieceScope:
    closed: bool  # it ends outside strings and brackets: the next piece starts afresh
    module: frozenset[str]  # the names its module-level code binds or reads


def _piece_scope(text: str) -> _PieceScope:
    lines, closed = read_lines(text)
    module: set[str] = set()
    _scan(lines, [], {}, module, collect=False)
    return _PieceScope(closed, frozenset(module))


def _piece(text: str) -> _PieceScope:
    return piece(text).fact(_piece_scope)


@functools.lru_cache(maxsize=4)
def scope_at(before: str, after: str = "") -> tuple[frozenset[str], str]:
    """:func:`names_in_scope` and the kind of the innermost block at the cursor: ``"def"``,
    ``"class"`` (directly in a class body) or ``"module"``. The last few answers are kept: the
    decoding monitor and the word finisher of one request ask about the same cursor.

    The code before the top-level statement the cursor is in contributes its module-level names
    only; those are worked out per :func:`~glm5_lsp.pysource.top_level_pieces` piece and kept, so a
    request re-reads the piece it edits and the cursor's own. A piece that ends inside a string or a
    bracket is read together with the next one, which makes the answer the same as reading the text
    in one go."""
    stack: list[Block] = []
    names: dict[Block, set[str]] = {}
    module: set[str] = set()
    pieces = top_level_pieces(before)
    pending = _module_names(pieces[:-1], module)
    lines = read_lines(pending + pieces[-1])[0]
    if lines:  # the cursor's own line closes the blocks it is not inside
        *body, cursor = lines
        _scan(body, stack, names, module)
        while stack and cursor.indent <= stack[-1].indent:
            stack.pop()
        (names.setdefault(stack[-1], set()) if stack else module).update(_NAME.findall(cursor.code))
    visible = set(module)
    for block in stack:
        if block.kind == "def" or block is stack[-1]:
            visible |= names.get(block, set())
    innermost = stack[-1].kind if stack else "module"
    newline = after.find("\n")
    if newline != -1:
        # The rest of the cursor's top-level statement is read with its blocks still open (their
        # names are not the module's); the pieces after it start afresh.
        rest = top_level_pieces(after[newline + 1:])
        count = 1
        lines, closed = read_lines(rest[0])
        while not closed and count < len(rest):
            count = count + 1 if count < MERGED_PIECES else len(rest)  # broken code: read the rest at once
            lines, closed = read_lines("".join(rest[:count]))
        _scan(lines, stack, names, module, collect=False)
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
    for number, text in enumerate(pieces):
        pending += text
        known = _piece(pending)
        if known.closed:
            module |= known.module
            pending, merged = "", 0
            continue
        merged += 1
        if merged >= MERGED_PIECES:  # broken code (an unclosed string or bracket): the rest in one go
            return pending + "".join(pieces[number + 1:])
    return pending
