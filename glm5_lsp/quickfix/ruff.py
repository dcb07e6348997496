"""ruff's own fixes for what ruff reported: an unused import removed, an ``f`` prefix without
placeholders dropped, ``== None`` made ``is None``.

One ``ruff check --isolated --output-format json --unsafe-fixes`` over the code (from stdin, under
the document's file name, which matters to ruff: ``__init__.py``), restricted to the rules of the
diagnostics being fixed. Each finding with a fix becomes a candidate titled as ruff titles it
("Remove unused import: `os`"); ruff's *safe* fixes rank before its unsafe ones, and a fix ruff
only displays is never offered. Rows and columns in ruff's JSON are 1-based, in characters.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Sequence

from glm5_lsp.checks.introduced import LineIndex
from glm5_lsp.checks.providers.process import run_checker
from glm5_lsp.checks.providers.ruff import find_ruff
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.quickfix.edits import Candidate, Edit

log = logging.getLogger(__name__)

UNSAFE_ORDER = 10.0  # an unsafe fix ranks after every safe one of the same cost


def ruff_candidates(code: str, diagnostics: Sequence[Diagnostic], path: str, timeout_s: float = 5.0,
                    executable: str | None = None) -> list[Candidate]:
    """ruff's fixes for the ruff findings among ``diagnostics`` (syntax errors excluded)."""
    codes = sorted({d.code for d in diagnostics if d.source == "ruff" and d.code and d.code != "invalid-syntax"})
    if not codes:
        return []
    try:
        ruff = find_ruff(executable)
    except FileNotFoundError:
        return []
    argv = [ruff, "check", "--isolated", "--no-cache", "--output-format", "json", "--unsafe-fixes",
            "--select", ",".join(codes), "--stdin-filename", path or "candidate.py", "-"]
    try:
        out = run_checker(argv, stdin=code, timeout_s=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as error:
        log.warning("ruff's fixes are not available: %s", error)
        return []
    if out.returncode not in (0, 1):
        log.warning("ruff failed (exit %s): %s", out.returncode, out.stderr.strip()[:200])
        return []
    try:
        items = json.loads(out.stdout or "[]")
    except json.JSONDecodeError:
        log.warning("ruff wrote something that is not JSON: %r", out.stdout[:200])
        return []
    index = LineIndex(code)
    found: list[Candidate] = []
    for item in items:
        candidate = _candidate(index, item, len(found))
        if candidate is not None:
            found.append(candidate)
    return found


def _candidate(index: LineIndex, item: dict, order: int) -> Candidate | None:
    fix = item.get("fix") or {}
    applicability = fix.get("applicability")
    if applicability not in ("safe", "unsafe") or not fix.get("edits"):
        return None
    edits = []
    for edit in fix["edits"]:
        start, end = edit.get("location") or {}, edit.get("end_location") or {}
        begin = index.offset(int(start.get("row", 1)) - 1, int(start.get("column", 1)) - 1)
        finish = index.offset(int(end.get("row", 1)) - 1, int(end.get("column", 1)) - 1)
        if finish < begin:
            return None
        edits.append(Edit(begin, finish, str(edit.get("content", ""))))
    safe = applicability == "safe"
    title = str(fix.get("message") or f"Apply ruff's fix for {item.get('code')}")
    line = int((item.get("location") or {}).get("row", 1)) - 1
    return Candidate(title, tuple(edits), "lint", "ruff", safe=safe, order=order + (0 if safe else UNSAFE_ORDER),
                     targets=(line,))
