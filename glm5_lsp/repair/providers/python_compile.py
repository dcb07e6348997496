"""Python's own compiler: the first syntax error, exactly as the interpreter will report it."""

from __future__ import annotations

from glm5_lsp.repair.diagnostics import Diagnostic
from glm5_lsp.repair.providers.positions import clamp_position, line_end


class PythonCompileProvider:
    """``compile(text, path, "exec")``; at most one diagnostic (the compiler stops at the first error)."""

    name = "compile"
    languages = frozenset({"python"})

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        try:
            compile(text, path or "<candidate>", "exec", dont_inherit=True)
        except SyntaxError as exc:  # IndentationError and TabError are subclasses
            return [_from_syntax_error(text, exc)]
        except ValueError as exc:  # "source code string cannot contain null bytes"
            return [Diagnostic(0, 0, 0, 0, str(exc), "error", self.name, "ValueError")]
        return []


def _from_syntax_error(text: str, exc: SyntaxError) -> Diagnostic:
    line, col = clamp_position(text, (exc.lineno or 1) - 1, (exc.offset or 1) - 1)
    end_line = (exc.end_lineno or exc.lineno or 1) - 1
    end_offset = exc.end_offset or 0
    if end_line < line or end_offset <= 0 or (end_line == line and end_offset - 1 <= col):
        end_line, end_col = line, max(col, min(col + 1, line_end(text, line)))
    else:
        end_line, end_col = clamp_position(text, end_line, end_offset - 1)
        end_line, end_col = max((end_line, end_col), (line, col))
    return Diagnostic(line, col, end_line, end_col, exc.msg or "invalid syntax", "error", "compile",
                      type(exc).__name__)
