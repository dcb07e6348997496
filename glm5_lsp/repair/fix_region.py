"""Where a model fix rewrites the code, and what it is shown.

A fix asks the model for the innermost function or class that holds the first diagnostic
(:func:`fix_region`: its body, or its header too when the error is there; the whole code outside
every block), shown as the buggy version with the diagnostics as comments (:func:`fix_header`) and
``error_context`` spans on the lines they name (:func:`error_spans`). A candidate that leaves working
code as nothing but ``pass``, ``...`` or comments is no fix (:func:`keeps_enough`).
Diagnostics here are dicts with a 0-based ``line``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from glm5_lsp.pysource import block_tree, innermost_block, logical_lines
from glm5_lsp.spans import Span

# A line that does nothing: what a body "fixed" by removing it is left with.
_EMPTY_LINE = re.compile(r"^\s*(?:pass|\.\.\.|return(?:\s+None)?;?)?\s*(?:#.*|//.*)?$")


@dataclass
class FixRegion:
    """Where a fix rewrites the code: the model is shown ``code[block_start:start]`` (the block's
    header) and writes ``code[start:end]``; ``code[block_start:block_end]`` is the block it sees as
    buggy."""

    block_start: int
    start: int
    end: int
    block_end: int


def fix_region(code: str, line: int | None, language: str = "python") -> FixRegion:
    """The part of ``code`` a fix rewrites, for a problem at 0-based ``line`` (None: unknown).

    Python: the innermost ``def``/``class`` whose block holds ``line`` (the first top-level one when
    ``line`` is None), read from the one block tree (:func:`glm5_lsp.pysource.block_tree`); its body
    is rewritten, or its header and body when ``line`` is in the header (a missing colon, a broken
    signature). Outside every block, and in other languages: the whole code.
    """
    whole = FixRegion(0, 0, len(code.rstrip()), len(code))
    if language != "python":
        return whole
    logical = logical_lines(code)
    if line is None:
        top = block_tree(logical)
        block = top[0] if top else None
    else:
        block = innermost_block(logical, line)
    if block is None:
        return whole
    lines = code.split("\n")
    starts = _line_starts(lines)
    h, header_end = block.header.first, block.header.last
    last = max(block.last, header_end)
    indent = len(lines[h]) - len(lines[h].lstrip(" \t"))
    block_start, block_end = starts[h], starts[last] + len(lines[last])
    if line is not None and line <= header_end:
        return FixRegion(block_start, block_start + indent, block_end, block_end)
    body_start = min(starts[header_end + 1], len(code))
    return FixRegion(block_start, body_start, max(body_start, block_end), block_end)


def working_lines(text: str) -> int:
    """Lines of ``text`` that do something: not blank, not only a comment, ``pass``, ``...`` or a bare
    ``return``. Code made of those alone compiles, so the checkers pass it, and a small model writes it."""
    return sum(1 for line in text.splitlines() if not _EMPTY_LINE.match(line))


def keeps_enough(old: str, new: str) -> bool:
    """Whether ``new`` is a fix of ``old`` rather than its removal: code of two or more working lines
    may not become none. (A shorter rewrite is fine: a performance hint's fix turns a four-line loop
    into one ``return``.)"""
    return working_lines(old) < 2 or working_lines(new) > 0




def line_of(item: dict[str, Any]) -> int | None:
    """A diagnostic's 0-based ``line``, if it names one (an int, not a bool)."""
    line = item.get("line")
    return line if isinstance(line, int) and not isinstance(line, bool) else None



def _line_starts(lines: list[str]) -> list[int]:
    """The offset where each of ``lines`` (a text split at line breaks) starts, and one past the end."""
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    return starts



def first_diagnostic_line(diagnostics: list[dict[str, Any]]) -> int | None:
    """The 0-based line of the first diagnostic that names one."""
    return next((line for line in map(line_of, diagnostics) if line is not None and line >= 0), None)



def error_spans(code: str, diagnostics: list[dict[str, Any]], offset: int = 0) -> list[Span]:
    """``error_context`` spans over the lines the diagnostics point at (0-based ``line``)."""
    lines = code.split("\n")
    starts = _line_starts(lines)
    spans = []
    marked: set[int] = set()
    for item in diagnostics:
        line = line_of(item)
        if line is not None and 0 <= line < len(lines) and line not in marked:
            marked.add(line)
            spans.append(Span(offset + starts[line], offset + starts[line] + len(lines[line]), "error_context"))
    return spans



def fix_header(code: str, diagnostics: list[dict[str, Any]], language: str) -> str:
    """The buggy code shown to the model, with the diagnostics as comments and a "fixed" marker."""
    marker = "#" if language == "python" else "//"
    lines = [f"{marker} Buggy version:", code.rstrip("\n")]
    for item in diagnostics[:8]:
        line = line_of(item)
        where = "somewhere" if line is None else f"line {line + 1}"
        lines.append(f"{marker} {where}: {item.get('message', '')}")
    lines.append(f"{marker} Fixed version:")
    return "\n".join(lines) + "\n"
