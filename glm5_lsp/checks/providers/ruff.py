"""ruff (when installed): its pyflakes-compatible rules and syntax errors, read from its JSON output.

Runs ``ruff check --isolated`` so a project's own ruff configuration (import sorting, line length)
does not turn style nits into blocking diagnostics; ``select`` chooses the rules (syntax + pyflakes
by default). Severity (:func:`severity_of`): syntax errors and the rules that fail at run time are
errors, ``F841`` (unused local, normal mid-edit) is info, the rest are warnings.

:class:`RuffProvider` starts one ``ruff check`` a check (about 5 ms of its 9 ms on a 2,600-line
file is the process starting); :mod:`.ruff_server` asks one long-lived ``ruff server`` instead and
converts its answers with :func:`ruff_diagnostic`, so both report the same.
"""

from __future__ import annotations

import json
import shutil

from glm5_lsp.checks.providers.process import DEFAULT_TIMEOUT_S, run_checker
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.positions import clamp_to_lines

ERROR_CODES: frozenset[str] = frozenset({
    "invalid-syntax", "F821", "F822", "F823", "F701", "F702", "F704", "F706", "F707", "F831",
    "F501", "F502", "F503", "F505", "F506", "F507", "F508", "F509", "F521", "F522", "F523", "F524", "F525",
})
INFO_CODES: frozenset[str] = frozenset({"F841", "F842"})


def find_ruff(executable: str | None = None) -> str:
    """``executable``, else ``ruff`` on PATH; FileNotFoundError when there is none."""
    found = executable or shutil.which("ruff")
    if found is None:
        raise FileNotFoundError("ruff is not installed (no `ruff` on PATH)")
    return found


class RuffProvider:
    name = "ruff"
    languages = frozenset({"python"})

    def __init__(self, executable: str | None = None, select: tuple[str, ...] = ("E9", "F"),
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.executable = find_ruff(executable)
        self.select = select
        self.timeout_s = timeout_s

    @property
    def bounded_s(self) -> float:
        """A ``ruff check`` process is killed at ``timeout_s``."""
        return self.timeout_s

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        argv = [self.executable, "check", "--isolated", "--no-cache", "--output-format", "json",
                "--select", ",".join(self.select), "--stdin-filename", path or "candidate.py", "-"]
        out = run_checker(argv, stdin=text, timeout_s=self.timeout_s)
        if out.returncode not in (0, 1):
            raise RuntimeError(f"ruff failed (exit {out.returncode}): {out.stderr.strip()[:200]}")
        items = json.loads(out.stdout or "[]")
        lines = text.split("\n") if items else []
        return [self._convert(lines, item) for item in items]

    def _convert(self, lines: list[str], item: dict) -> Diagnostic:
        start, end = item.get("location") or {}, item.get("end_location") or {}
        line, col = int(start.get("row", 1)) - 1, int(start.get("column", 1)) - 1
        end_line, end_col = int(end.get("row", line + 1)) - 1, int(end.get("column", 1)) - 1
        return ruff_diagnostic(lines, item.get("code"), str(item.get("message", "")), (line, col), (end_line, end_col),
                               self.name)


def severity_of(code: str) -> str:
    """Syntax errors and the rules that fail at run time are errors, unused locals info, the rest warnings."""
    if code in ERROR_CODES or code.startswith("E9"):
        return "error"
    return "info" if code in INFO_CODES else "warning"


def ruff_diagnostic(lines: list[str], code: object, message: str, start: tuple[int, int], end: tuple[int, int],
                    source: str = "ruff") -> Diagnostic:
    """One ruff finding as a :class:`Diagnostic`: 0-based ``(line, character column)`` positions
    clamped into the checked text's ``lines`` (ruff points one past the end at times), a missing code
    read as a syntax error."""
    code = str(code or "invalid-syntax")
    line, col = clamp_to_lines(lines, *start)
    end_line, end_col = max(clamp_to_lines(lines, *end), (line, col))
    return Diagnostic(line, col, end_line, end_col, message, severity_of(code), source, code)
