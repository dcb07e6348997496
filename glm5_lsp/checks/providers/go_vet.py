"""``go vet`` (when installed) for Go: syntax and type errors and vet's own checks, on a temporary copy.

Every finding is an error: vet reports only what is almost certainly a bug.
"""

from __future__ import annotations

import re
import shutil

from glm5_lsp.checks.providers.process import run_checker, temp_folder, write_temp_source
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.positions import byte_col_to_char, clamp_position

# "./candidate.go:3:2: undefined: y" (vet prefixes some lines with "vet: ")
_LINE = re.compile(r"^(?:vet: )?(?:\./)?(?P<file>[^\s:]+\.go):(?P<line>\d+):(?P<col>\d+): (?P<msg>.*)$")


class GoVetProvider:
    name = "go vet"
    languages = frozenset({"go"})

    def __init__(self, executable: str | None = None, timeout_s: float = 30.0) -> None:
        found = executable or shutil.which("go")
        if found is None:
            raise FileNotFoundError("go is not installed")
        self.executable = found
        self.timeout_s = timeout_s

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        with temp_folder() as folder:
            source = write_temp_source(folder, "candidate.go", text, ".go")
            (source.parent / "go.mod").write_text("module candidate\n\ngo 1.20\n", encoding="utf-8")
            out = run_checker([self.executable, "vet", "./..."], timeout_s=self.timeout_s, cwd=folder)
        found: list[Diagnostic] = []
        for raw in (out.stderr + "\n" + out.stdout).splitlines():
            match = _LINE.match(raw.strip())
            if match is None or match.group("file") != source.name:
                continue
            line, _ = clamp_position(text, int(match.group("line")) - 1, 0)
            col = byte_col_to_char(text, line, int(match.group("col")) - 1)
            line, col = clamp_position(text, line, col)
            found.append(Diagnostic(line, col, line, col, match.group("msg"), "error", self.name, ""))
        if out.returncode != 0 and not found:
            raise RuntimeError(f"go vet failed without a diagnostic: {out.stderr.strip()[:200]}")
        return found
