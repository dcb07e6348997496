"""``gcc``/``g++ -fsyntax-only`` (when installed) for C and C++: real compiler errors and warnings."""

from __future__ import annotations

import re
import shutil

from glm5_lsp.checks.providers.process import DEFAULT_TIMEOUT_S, run_checker
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.positions import byte_col_to_char, clamp_position

# "<stdin>:3:12: error: expected ';' before '}' token"
_LINE = re.compile(r"^<stdin>:(\d+):(\d+): (fatal error|error|warning|note): (.*)$")
_SEVERITY = {"fatal error": "error", "error": "error", "warning": "warning", "note": "info"}


class GccProvider:
    """C through ``gcc -x c``, C++ through ``g++ -x c++``; the text is given on stdin."""

    languages = frozenset({"c", "cpp"})

    def __init__(self, language: str = "c", executable: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if language not in self.languages:
            raise ValueError(f"GccProvider checks 'c' or 'cpp', not {language!r}")
        compiler = "gcc" if language == "c" else "g++"
        found = executable or shutil.which(compiler)
        if found is None:
            raise FileNotFoundError(f"{compiler} is not installed")
        self.name = compiler
        self.languages = frozenset({language})
        self.executable = found
        self.flag = "c" if language == "c" else "c++"
        self.timeout_s = timeout_s

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        argv = [self.executable, "-fsyntax-only", "-fno-diagnostics-color", "-fdiagnostics-column-unit=byte",
                "-x", self.flag, "-"]
        out = run_checker(argv, stdin=text, timeout_s=self.timeout_s)
        found: list[Diagnostic] = []
        for raw in out.stderr.splitlines():
            match = _LINE.match(raw)
            if match is None:
                continue
            kind = match.group(3)
            if kind == "note":
                continue
            line, _ = clamp_position(text, int(match.group(1)) - 1, 0)
            line, col = clamp_position(text, line, byte_col_to_char(text, line, int(match.group(2)) - 1))
            found.append(Diagnostic(line, col, line, col, match.group(4), _SEVERITY[kind], self.name, ""))
        if out.returncode != 0 and not any(d.severity == "error" for d in found):
            raise RuntimeError(f"{self.name} failed without a diagnostic: {out.stderr.strip()[:200]}")
        return found
