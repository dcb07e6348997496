"""``node --check`` (when installed) for JavaScript: the syntax error V8 reports, if any."""

from __future__ import annotations

import re
import shutil

from glm5_lsp.checks.providers.process import DEFAULT_TIMEOUT_S, run_checker, temp_folder, write_temp_source
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.positions import clamp_position

_ERROR = re.compile(r"^(\w*Error): (.*)$")


class NodeCheckProvider:
    name = "node"
    languages = frozenset({"javascript", "javascriptreact"})

    def __init__(self, executable: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        found = executable or shutil.which("node")
        if found is None:
            raise FileNotFoundError("node is not installed")
        self.executable = found
        self.timeout_s = timeout_s

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        with temp_folder() as folder:
            source = write_temp_source(folder, "candidate.js" if not path.endswith((".js", ".mjs", ".cjs"))
                                       else path, text, ".js")
            out = run_checker([self.executable, "--check", str(source)], timeout_s=self.timeout_s)
        if out.returncode == 0:
            return []
        return [_parse(text, str(source), out.stderr)]


def _parse(text: str, source: str, stderr: str) -> Diagnostic:
    """stderr reads ``FILE:LINE`` / the line / a caret line / blank / ``SyntaxError: message``."""
    lines = stderr.splitlines()
    line, col, message, code = 0, 0, stderr.strip()[:200] or "node --check failed", "SyntaxError"
    for i, raw in enumerate(lines):
        if raw.startswith(source + ":") and raw[len(source) + 1:].isdigit():
            line = int(raw[len(source) + 1:]) - 1
            if i + 2 < len(lines) and "^" in lines[i + 2]:
                col = lines[i + 2].index("^")
        match = _ERROR.match(raw)
        if match:
            code, message = match.group(1), match.group(2)
            break
    line, col = clamp_position(text, line, col)
    return Diagnostic(line, col, line, col + 1 if col < len(text.split("\n")[line]) else col, message,
                      "error", "node", code)
