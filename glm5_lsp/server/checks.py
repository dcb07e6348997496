"""Check an edit before it is offered: spliced into its document, it must add no error, and a fix
must leave fewer errors than it found. Uses the repair layer's providers (no LSP types here)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from glm5_lsp.repair.diagnostics import Diagnostic
from glm5_lsp.repair.introduced import Splice, judge
from glm5_lsp.repair.providers import DiagnosticRunner, default_runner

CHECK_TIMEOUT_S = 5.0


def diff_region(old: str, new: str) -> tuple[int, int, str]:
    """``(start, end, text)``: the smallest single replacement of ``old[start:end]`` giving ``new``."""
    limit = min(len(old), len(new))
    start = 0
    while start < limit and old[start] == new[start]:
        start += 1
    tail = 0
    while tail < limit - start and old[len(old) - 1 - tail] == new[len(new) - 1 - tail]:
        tail += 1
    return start, len(old) - tail, new[start : len(new) - tail]


@functools.cache
def runner_for(language: str) -> DiagnosticRunner:
    """The diagnostic providers for a language (external tools included when installed)."""
    return default_runner(language, timeout_s=CHECK_TIMEOUT_S)


def diagnose(text: str, path: str, language: str) -> list[Diagnostic]:
    """Our own compiler diagnostics for a document."""
    return runner_for(language).diagnose(text, path, language).diagnostics


@dataclass
class Verdict:
    """Whether an edit may be offered, and why not."""

    ok: bool
    introduced: list[Diagnostic]
    errors_before: int
    errors_after: int

    def reason(self) -> str:
        if self.introduced:
            first = self.introduced[0]
            return f"it would add: {first.message} (line {first.line + 1})"
        if self.errors_after >= self.errors_before:
            return "it does not remove any error"
        return ""


def check_edit(document: str, start: int, end: int, text: str, *, path: str, language: str,
               must_reduce_errors: bool) -> Verdict:
    """Judge ``document[start:end] = text``: no new error, and (for a fix) fewer errors than before."""
    judgement = judge(Splice(document, start, end, text), runner_for(language), path, language)
    introduced = judgement.blocking()
    before = sum(d.severity == "error" for d in judgement.before)
    after = sum(d.severity == "error" for d in judgement.after)
    ok = not introduced and (after < before or not must_reduce_errors)
    return Verdict(ok=ok, introduced=introduced, errors_before=before, errors_after=after)
