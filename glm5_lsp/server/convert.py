"""The protocol edge: every conversion between LSP types and the project's plain values.

LSP positions count code units of the negotiated encoding (UTF-16 unless the client and server
agreed on UTF-8 or UTF-32) on lines broken at ``\n``, ``\r\n`` and ``\r`` only; the rest of the
project counts characters (code points), and the checkers number lines by ``\n``. Every function
takes the text as a string (a whole document) or a :class:`~glm5_lsp.server.text.View` (what a
request read: a window of a large document, positioned in the whole), and the ``encoding``.
Nothing outside ``glm5_lsp.server`` sees an ``lsprotocol`` type.
"""

from __future__ import annotations

import re

from lsprotocol import types

from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.server.text import View, encoding_name
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
Text = str | View


def as_view(text: Text, encoding: str = UTF16) -> View:
    """``text`` as a :class:`View` (a plain string is a whole document)."""
    return text if isinstance(text, View) else View.whole(text, encoding_name(encoding))


def lsp_offset(text: Text, position: types.Position, encoding: str = UTF16) -> int | None:
    """The character offset of an LSP position in ``text``: past the end of a line it is the line's
    end (the protocol's rule); None past the last line (or outside a window)."""
    return as_view(text, encoding).offset(position)


def lsp_position(text: Text, offset: int, encoding: str = UTF16) -> types.Position:
    """The LSP position of a character offset (clamped into the text)."""
    return as_view(text, encoding).position(offset)


def lsp_range(text: Text, start: int, end: int, encoding: str = UTF16) -> types.Range:
    view = as_view(text, encoding)
    return types.Range(start=view.position(start), end=view.position(end))


def _column_offset(view: View, line: int, column: int) -> int:
    """The offset of a repair-layer ``(line, column)``: lines split at ``\n`` as the checkers count
    them, the column in characters (clamped into the text)."""
    starts = view.newline_starts()
    if line >= len(starts):
        return len(view.text)
    line = max(0, line)
    end = starts[line + 1] - 1 if line + 1 < len(starts) else len(view.text)
    return min(starts[line] + max(0, column), end)


def lsp_position_of_column(text: Text, line: int, column: int, encoding: str = UTF16) -> types.Position:
    """The LSP position of a repair-layer (line, character column) pair, clamped into the text."""
    view = as_view(text, encoding)
    return view.position(_column_offset(view, line, column))


def lsp_diagnostic(text: Text, diagnostic: Diagnostic, encoding: str = UTF16) -> types.Diagnostic:
    """A repair-layer diagnostic as an LSP one, positioned in ``text``."""
    view = as_view(text, encoding)
    return types.Diagnostic(
        range=types.Range(
            start=view.position(_column_offset(view, diagnostic.line, diagnostic.col)),
            end=view.position(_column_offset(view, diagnostic.end_line, diagnostic.end_col)),
        ),
        message=diagnostic.message,
        severity=_SEVERITY_TO_LSP.get(diagnostic.severity, types.DiagnosticSeverity.Error),
        source=f"glm5-lsp ({diagnostic.source})" if diagnostic.source else "glm5-lsp",
        code=diagnostic.code or None,
    )


def diagnostic_from_lsp(text: Text, diagnostic: types.Diagnostic, encoding: str = UTF16) -> Diagnostic | None:
    """A client's LSP diagnostic as the repair layer's type (columns in characters), or None when
    it lies outside a window of the document."""
    view = as_view(text, encoding)
    start = view.offset(diagnostic.range.start)
    end = view.offset(diagnostic.range.end)
    if view.windowed and (start is None or end is None):
        return None
    start = len(view.text) if start is None else start
    end = max(start, len(view.text) if end is None else end)
    start_pos, end_pos = line_col(view.text, start), line_col(view.text, end)
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


def lsp_text_edit(old: Text, start: int, end: int, text: str, encoding: str = UTF16) -> types.TextEdit:
    """An edit replacing ``old[start:end]`` (character offsets) with ``text``."""
    return types.TextEdit(range=lsp_range(old, start, end, encoding), new_text=text)


def lsp_lines_overlap(a: types.Range, b: types.Range) -> bool:
    """Whether two ranges share a line. A quick fix is offered for the problems on the cursor's
    line, wherever on it the cursor is: a compiler reports a syntax error where it noticed it (the
    end of ``return a +``), not where the user looks, and editors ask for the line's fixes."""
    return a.start.line <= b.end.line and b.start.line <= a.end.line
