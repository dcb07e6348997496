"""What a checker reports (:class:`Diagnostic`) and the one interface every checker implements.

Positions are 0-based lines and 0-based character columns (not bytes), end exclusive, so they convert
to LSP ranges at the server's edge without arithmetic. Providers live in ``glm5_lsp.checks.providers``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

SEVERITIES: tuple[str, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Diagnostic:
    """One problem a provider found in a text."""

    line: int
    col: int
    end_line: int
    end_col: int
    message: str
    severity: str = "error"
    source: str = ""  # the provider's name: "compile", "tree-sitter", "pyflakes", "ruff", "gcc", ...
    code: str = ""  # the provider's rule id when it has one ("F821", "UndefinedName", ...)

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}; expected one of {SEVERITIES}")
        if self.line < 0 or self.col < 0:
            raise ValueError(f"negative position {self.line}:{self.col}")
        if (self.end_line, self.end_col) < (self.line, self.col):
            raise ValueError(f"range ends before it starts: {self.line}:{self.col}-{self.end_line}:{self.end_col}")

    def key(self) -> tuple[str, str, str]:
        """What identifies the problem independently of where it is: source, code, and the message
        with line numbers blanked (pyflakes says "redefinition of unused 'x' from line 3")."""
        return (self.source, self.code, _LINE_REF.sub("line N", self.message))

    def hint(self, text: str | None = None) -> str:
        """One readable line: what the checker said, where (1-based line), and the offending text."""
        where = f"line {self.line + 1}"
        head = f"{self.severity} ({self.source or 'check'}) {where}: {self.message}"
        if text is None:
            return head
        lines = text.splitlines()
        if self.line >= len(lines):
            return head
        offending = lines[self.line].strip()
        if len(offending) > 80:
            offending = offending[:77] + "..."
        return f"{head}: `{offending}`" if offending else head


_LINE_REF = re.compile(r"\bline \d+")


class DiagnosticProvider(Protocol):
    """A checker. ``diagnose`` may raise or run long: the runner (``providers.runner``) times it out,
    logs and skips it, so a broken checker never blocks a completion.

    A checker that stops itself (it asks a helper process with a deadline) may say so with a
    ``bounded_s`` attribute: the deadline of one check, within which ``diagnose`` returns or raises
    on its own once it has its turn (a helper answers one check at a time; None: no bound). The
    runner calls such a checker in the calling thread when the deadline fits its own time limit.
    One may also have ``submit(text, path, language)``: the check sent off at once, returning a
    function that waits for its answer (``diagnose`` is then ``submit(...)()``); the runner sends
    every such check before it reads any answer, and calls each returned function exactly once."""

    name: str
    languages: frozenset[str]  # language ids it can check: "python", "javascript", "typescript", ...

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]: ...


def sort_diagnostics(diagnostics: Sequence[Diagnostic]) -> list[Diagnostic]:
    """Position order, errors before warnings at the same place."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(diagnostics, key=lambda d: (d.line, d.col, rank[d.severity], d.source, d.message))
