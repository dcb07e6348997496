"""The protocol edge: every conversion between LSP types and the project's plain values.

LSP positions count code units of the negotiated encoding (UTF-16 unless the client and server
agreed on UTF-8 or UTF-32); the rest of the project counts characters (code points). Every function
that touches a position takes that ``encoding``. Nothing outside ``glm5_lsp.server`` sees an
``lsprotocol`` type.
"""

from __future__ import annotations

import re

from lsprotocol import types

from glm5_lsp.repair.diagnostics import Diagnostic
from glm5_lsp.repair.providers.positions import char_units, column_from_units
from glm5_lsp.textdiff import line_col

_SEVERITY_TO_LSP = {
    "error": types.DiagnosticSeverity.Error,
    "warning": types.DiagnosticSeverity.Warning,
    "info": types.DiagnosticSeverity.Information,
}
_SEVERITY_FROM_LSP = {
    types.DiagnosticSeverity.Error: "error",
    types.DiagnosticSeverity.Warning: "warning",
    types.DiagnosticSeverity.Information: "info",
    types.DiagnosticSeverity.Hint: "info",
}


UTF16 = "utf-16"


def _units(text: str, encoding: str) -> int:
    if encoding == "utf-32" or text.isascii():
        return len(text)
    return sum(char_units(ch, encoding) for ch in text)


def _line_starts(text: str) -> list[int]:
    starts = [0]
    index = text.find("\n")
    while index >= 0:
        starts.append(index + 1)
        index = text.find("\n", index + 1)
    return starts


def lsp_offset(text: str, position: types.Position, encoding: str = UTF16) -> int | None:
    """The character offset of an LSP position in ``text``, or None when it lies past the end."""
    starts = _line_starts(text)
    if position.line < 0 or position.line >= len(starts):
        return None
    start = starts[position.line]
    end = starts[position.line + 1] - 1 if position.line + 1 < len(starts) else len(text)
    line = text[start:end].rstrip("\r")
    column = column_from_units(line, position.character, encoding)
    return None if column is None else start + column


def lsp_position(text: str, offset: int, encoding: str = UTF16) -> types.Position:
    """The LSP position of a character offset (clamped into the text)."""
    offset = max(0, min(offset, len(text)))
    line = text.count("\n", 0, offset)
    line_start = text.rfind("\n", 0, offset) + 1
    return types.Position(line=line, character=_units(text[line_start:offset], encoding))


def lsp_range(text: str, start: int, end: int, encoding: str = UTF16) -> types.Range:
    return types.Range(start=lsp_position(text, start, encoding), end=lsp_position(text, end, encoding))


def lsp_position_of_column(text: str, line: int, column: int, encoding: str = UTF16) -> types.Position:
    """The LSP position of a (line, character column) pair, clamped into the text."""
    lines = text.split("\n")
    if line >= len(lines):
        return lsp_position(text, len(text), encoding)
    return types.Position(line=line, character=_units(lines[line][:column], encoding))


def lsp_diagnostic(text: str, diagnostic: Diagnostic, encoding: str = UTF16) -> types.Diagnostic:
    """A repair-layer diagnostic as an LSP one, positioned in ``text``."""
    return types.Diagnostic(
        range=types.Range(
            start=lsp_position_of_column(text, diagnostic.line, diagnostic.col, encoding),
            end=lsp_position_of_column(text, diagnostic.end_line, diagnostic.end_col, encoding),
        ),
        message=diagnostic.message,
        severity=_SEVERITY_TO_LSP.get(diagnostic.severity, types.DiagnosticSeverity.Error),
        source=f"glm5-lsp ({diagnostic.source})" if diagnostic.source else "glm5-lsp",
        code=diagnostic.code or None,
    )


def diagnostic_from_lsp(text: str, diagnostic: types.Diagnostic, encoding: str = UTF16) -> Diagnostic:
    """A client's LSP diagnostic as the repair layer's type (columns in characters)."""
    start = lsp_offset(text, diagnostic.range.start, encoding)
    end = lsp_offset(text, diagnostic.range.end, encoding)
    start = len(text) if start is None else start
    end = max(start, len(text) if end is None else end)
    start_pos, end_pos = line_col(text, start), line_col(text, end)
    return Diagnostic(
        line=start_pos[0],
        col=start_pos[1],
        end_line=end_pos[0],
        end_col=end_pos[1],
        message=diagnostic.message,
        severity=_SEVERITY_FROM_LSP.get(diagnostic.severity or types.DiagnosticSeverity.Error, "error"),
        source=_provider_of(diagnostic.source),
        code=str(diagnostic.code) if diagnostic.code is not None else "",
    )


def _provider_of(source: str | None) -> str:
    """``"glm5-lsp (pyflakes)"`` -> ``"pyflakes"`` (our own, as :func:`lsp_diagnostic` named it); others kept."""
    match = _OUR_SOURCE.fullmatch(source or "")
    return match.group(1) if match else (source or "client")


_OUR_SOURCE = re.compile(r"glm5-lsp \((.+)\)")


def lsp_text_edit(old: str, start: int, end: int, text: str, encoding: str = UTF16) -> types.TextEdit:
    """An edit replacing ``old[start:end]`` (character offsets) with ``text``."""
    return types.TextEdit(range=lsp_range(old, start, end, encoding), new_text=text)


def lsp_lines_overlap(a: types.Range, b: types.Range) -> bool:
    """Whether two ranges share a line. A quick fix is offered for the problems on the cursor's
    line, wherever on it the cursor is: a compiler reports a syntax error where it noticed it (the
    end of ``return a +``), not where the user looks, and editors ask for the line's fixes."""
    return a.start.line <= b.end.line and b.start.line <= a.end.line
