"""Check an edit before it is offered: spliced into its document it must add no error or warning,
and a fix must remove what it was asked to fix. Also our own diagnostics for a document (the repair
layer's providers plus its performance hints). No LSP types here."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from glm5_lsp.checks.introduced import Splice, judge
from glm5_lsp.checks.perf_hints import perf_hints
from glm5_lsp.checks.providers import DiagnosticRunner, default_runner
from glm5_lsp.diagnostics import Diagnostic

CHECK_TIMEOUT_S = 5.0
PERF_SOURCE = "perf"  # the ``source`` of performance hints published as information diagnostics
_OUR_SOURCES = frozenset({"compile", "tree-sitter", "pyflakes", "ruff", "gcc", "g++", "node", "go vet"})


@functools.cache
def runner_for(language: str) -> DiagnosticRunner:
    """The diagnostic providers for a language (external tools included when installed)."""
    return default_runner(language, timeout_s=CHECK_TIMEOUT_S)


def diagnose(text: str, path: str, language: str) -> list[Diagnostic]:
    """Our own diagnostics for a document: the compilers' and, for Python, performance hints."""
    found = runner_for(language).diagnose(text, path, language).diagnostics
    if language == "python":
        found = found + [
            Diagnostic(line=h.line, col=h.col, end_line=h.end_line, end_col=h.end_col,
                       message=f"{h.message}. Suggested:\n{h.rewrite}", severity="info", source=PERF_SOURCE,
                       code=h.rule)
            for h in perf_hints(text)
        ]
    return found


@dataclass
class Verdict:
    """Whether an edit may be offered, and why not."""

    ok: bool
    introduced: list[Diagnostic]
    unresolved: list[Diagnostic]  # targeted diagnostics of ours that the edit leaves in place

    def reason(self) -> str:
        if self.introduced:
            first = self.introduced[0]
            return f"it would add: {first.message} (line {first.line + 1})"
        if self.unresolved:
            return f"it does not fix: {self.unresolved[0].message.splitlines()[0]}"
        return ""


def check_edit(document: str, start: int, end: int, text: str, *, path: str, language: str,
               targets: Sequence[Diagnostic] = ()) -> Verdict:
    """Judge ``document[start:end] = text``.

    It must add no error or warning; and each targeted diagnostic that our own checkers reported
    (``targets``, e.g. the ones a "Fix" action was offered for) must be gone, judged by how many of
    that kind the document has before and after. Targets from other tools cannot be re-checked here;
    for them the edit only has to add nothing.
    """
    splice = Splice(document, start, end, text)
    judgement = judge(splice, runner_for(language), path, language)
    introduced = judgement.blocking(("error", "warning"))
    spliced = splice.apply()
    unresolved = []
    for target in targets:
        if target.source == PERF_SOURCE:
            before = sum(h.rule == target.code for h in perf_hints(document))
            after = sum(h.rule == target.code for h in perf_hints(spliced))
        elif target.source in _OUR_SOURCES:
            before = sum(d.key() == target.key() for d in judgement.before)
            after = sum(d.key() == target.key() for d in judgement.after)
        else:
            continue
        if after >= before:
            unresolved.append(target)
    ok = not introduced and not unresolved and text != document[start:end]
    return Verdict(ok=ok, introduced=introduced, unresolved=unresolved)
