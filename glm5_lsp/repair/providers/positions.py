"""Position helpers shared by providers: 1-based/byte positions to 0-based character columns."""

from __future__ import annotations


def clamp_position(text: str, line: int, col: int) -> tuple[int, int]:
    """Clamp a 0-based (line, col) into ``text``; checkers sometimes point one past the end."""
    lines = text.split("\n")
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
