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


def _blank(match: re.Match[str]) -> str:
    return "" if match.group(0).startswith("#") else "0"  # a string stays an operand, on one line


def logical_lines(text: str) -> list[tuple[int, str]]:
    """``(indentation, code)`` for each logical line of ``text``, strings and comments blanked out.

    The last physical line is kept even when blank: its indentation is where the cursor stands."""
    code = _STRING_OR_COMMENT.sub(_blank, text)
    out: list[tuple[int, str]] = []
    depth = 0
    joined: list[str] = []
    indent = 0
    physical = code.split("\n")
    for number, line in enumerate(physical):
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
    if joined:
        out.append((indent, " ".join(joined)))
    return out


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


@functools.lru_cache(maxsize=4)
def scope_at(before: str, after: str = "") -> tuple[frozenset[str], str]:
    """:func:`names_in_scope` and the kind of the innermost block at the cursor: ``"def"``,
    ``"class"`` (directly in a class body) or ``"module"``. The last few answers are kept: the
    decoding monitor and the word finisher of one request ask about the same cursor."""
    blocks: list[_Block] = []
    module: set[str] = set()
    lines = logical_lines(before)
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
        _scan(logical_lines(after[newline + 1:]), blocks, module, collect=False)
        visible |= module
    return frozenset(visible | ALWAYS), innermost
