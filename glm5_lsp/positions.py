"""Position helpers shared by providers and the server: 1-based, byte and code-unit positions to
0-based character (code point) columns."""

from __future__ import annotations

import re

# The line breaks LSP counts: "\n", "\r\n" and "\r" only (``str.splitlines`` also breaks at \x0b,
# \x0c, \x1c-\x1e, \x85, \u2028 and \u2029, which LSP counts as ordinary characters).
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def clamp_position(text: str, line: int, col: int) -> tuple[int, int]:
    """Clamp a 0-based (line, col) into ``text``; checkers sometimes point one past the end."""
    return clamp_to_lines(text.split("\n"), line, col)


def clamp_to_lines(lines: list[str], line: int, col: int) -> tuple[int, int]:
    """:func:`clamp_position` on a text already split into ``lines`` (split once for many findings:
    a 2,600-line file takes about 0.1 ms to split)."""
    line = max(0, min(line, len(lines) - 1))
    col = max(0, min(col, len(lines[line])))
    return line, col


def byte_col_to_char(text: str, line: int, byte_col: int) -> int:
    """Convert a UTF-8 byte column on ``line`` (0-based) to a character column."""
    lines = text.split("\n")
    if not 0 <= line < len(lines):
        return 0
    encoded = lines[line].encode("utf-8")
    return len(encoded[:max(0, byte_col)].decode("utf-8", errors="ignore"))


def line_end(text: str, line: int) -> int:
    lines = text.split("\n")
    return len(lines[line]) if 0 <= line < len(lines) else 0


def char_units(ch: str, encoding: str) -> int:
    """Code units of one character in ``encoding`` (``"utf-8"``, ``"utf-16"`` or ``"utf-32"``)."""
    if encoding == "utf-8":
        return len(ch.encode("utf-8"))
    if encoding == "utf-32":
        return 1
    return 2 if ord(ch) > 0xFFFF else 1


def column_from_units(line: str, units: int, encoding: str) -> int | None:
    """The character column ``units`` code units into ``line``, or None past the line's end."""
    if line.isascii() or encoding == "utf-32":
        return units if units <= len(line) else None
    count = 0
    for index, ch in enumerate(line):
        if count >= units:
            return index  # a position inside a multi-unit character snaps to its start
        count += char_units(ch, encoding)
        if count > units:
            return index
    return len(line) if units <= count else None
