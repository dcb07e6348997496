"""Every candidate spliced and judged by the same checks, then ranked.

A candidate is judged as the repair loop judges the model's (``repair.introduced``): the text with
the candidate spliced in is diagnosed by the document's runner (compile, ruff or pyflakes, ...) plus
the fixer's own attribute check (:func:`~glm5_lsp.quickfix.names.attribute_problems`), and only what
it *introduces* counts against it. It is kept when it introduces no blocking diagnostic and makes
progress: fewer syntax errors, or as many and fewer blocking diagnostics (a repaired parse may
reveal the file's other findings, which then count as the file's own, not the fix's).

Ranking (:func:`rank_key`): fewest blocking diagnostics left, then the smallest edit
(:meth:`Candidate.edit_cost`), then fewer diagnostics of any severity, then ruff's safe fixes
before its unsafe ones, then the generator's own order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from glm5_lsp.checks.introduced import LineIndex, Splice, introduced_diagnostics, is_syntax_error
from glm5_lsp.checks.providers.runner import DiagnosticRunner
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.quickfix.edits import Candidate

BLOCKING: tuple[str, ...] = ("error", "warning")
EXTRA_KINDS = frozenset({"attribute", "import"})  # fixes judged with the fixer's own checks too


@dataclass
class Fix:
    """One way to fix the code: the whole fixed text, what it says it does, and what it leaves."""

    title: str
    text: str  # the whole code with the fix applied
    kind: str  # "syntax", "lint", "name", "import", "attribute", "model"; "several" for a chain
    source: str  # "parser", "tree-sitter", "ruff", "names", "model"
    diagnostics: list[Diagnostic]  # every diagnostic the fixed text still has
    introduced: list[Diagnostic] = field(default_factory=list)  # what the fix added (nothing blocking)
    cost: float = 0.0
    safe: bool = True
    preferred: bool = False
    steps: tuple[str, ...] = ()  # the titles of the fixes applied one after another, for a chain
    order: float = 0.0
    seconds: float = 0.0  # the time it took to find

    def blocking(self, severities: Sequence[str] = BLOCKING) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity in severities]

    def clean(self, severities: Sequence[str] = BLOCKING) -> bool:
        return not self.blocking(severities)

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title, "text": self.text, "kind": self.kind, "source": self.source,
            "diagnostics": [_as_dict(d) for d in self.diagnostics], "preferred": self.preferred,
            "clean": self.clean(), "safe": self.safe, "steps": list(self.steps),
        }


def _as_dict(d: Diagnostic) -> dict[str, Any]:
    return {"line": d.line, "col": d.col, "end_line": d.end_line, "end_col": d.end_col, "message": d.message,
            "severity": d.severity, "source": d.source, "code": d.code}


def rank_key(fix: Fix, severities: Sequence[str] = BLOCKING) -> tuple[float, ...]:
    return (len(fix.blocking(severities)), fix.cost, len(fix.diagnostics), 0 if fix.safe else 1, fix.order)


def score(diagnostics: Sequence[Diagnostic], severities: Sequence[str] = BLOCKING) -> tuple[int, int]:
    """Syntax errors, then blocking diagnostics."""
    return (sum(1 for d in diagnostics if is_syntax_error(d)), sum(1 for d in diagnostics if d.severity in severities))


def progress(before: Sequence[Diagnostic], after: Sequence[Diagnostic], splice: Splice,
             severities: Sequence[str] = BLOCKING) -> bool:
    """Whether the spliced text is further along than the document.

    While the document does not parse: the compiler's first error must be gone or lie past where
    the old one now stands (the compiler reports one error, where parsing stopped; a candidate that
    only moves the trouble earlier, or reshuffles ruff's follow-on errors, is no step forward).
    Without the compiler's word: fewer syntax errors. Once it parses: no syntax error, and fewer
    blocking diagnostics."""
    old_syntax = [d for d in before if is_syntax_error(d)]
    new_syntax = [d for d in after if is_syntax_error(d)]
    if not old_syntax:
        return not new_syntax and score(after, severities) < score(before, severities)
    if not new_syntax:
        return True
    old_first = _first_compile_error(before)
    new_first = _first_compile_error(after)
    if old_first is None:
        return score(after, severities) < score(before, severities)
    if new_first is None:
        return True  # the compiler is happy; only ruff's recovery still complains
    old_at = LineIndex(splice.document).offset(old_first.line, old_first.col)
    moved = splice.map_offset(old_at)
    if moved is None:  # the error stood inside the replaced text: past it, at least
        moved = splice.start + len(splice.text)
    new_at = LineIndex(splice.apply()).offset(new_first.line, new_first.col)
    return new_at > moved


def _first_compile_error(diagnostics: Sequence[Diagnostic]) -> Diagnostic | None:
    return next((d for d in diagnostics if d.source == "compile" and is_syntax_error(d)), None)


class Checks:
    """The diagnostics of a text: the runner's, plus ``extra`` (the fixer's own checks) on texts that
    parse; each text's answer remembered, since chains and rankings ask about the same texts."""

    def __init__(self, runner: DiagnosticRunner, path: str, language: str,
                 extra: Callable[[str], list[Diagnostic]] | None = None,
                 severities: Sequence[str] = BLOCKING) -> None:
        self.runner = runner
        self.path = path
        self.language = language
        self.extra = extra
        self.severities = tuple(severities)
        self._seen: dict[str, tuple[list[Diagnostic], frozenset[str], bool]] = {}
        self.checked = 0  # texts diagnosed (for tests and logs)

    def diagnose(self, text: str, extra: bool = True) -> tuple[list[Diagnostic], frozenset[str]]:
        """``(diagnostics, providers that gave up)`` for ``text`` (without the fixer's own checks
        when not ``extra``)."""
        known = self._seen.get(text)
        if known is not None and (known[2] or not extra or self.extra is None):
            return known[0], known[1]
        report = self.runner.diagnose(text, self.path, self.language)
        found = list(report.diagnostics)
        # Only on a text the checkers pass: while they find something, that is what a fix answers
        # first, and the whole-file read (0.2 s on a 2,600-line file) waits for the chain's next step.
        with_extra = extra and self.extra is not None and not any(d.severity in self.severities for d in found)
        if with_extra:
            found += self.extra(text)
        answer = (found, frozenset(entry.split(":", 1)[0] for entry in report.skipped), with_extra)
        self._seen[text] = answer
        self.checked += 1
        return answer[0], answer[1]

    def judge(self, document: str, candidate: Candidate, before: Sequence[Diagnostic],
              before_skipped: frozenset[str] = frozenset()) -> Fix | None:
        """``candidate`` applied to ``document`` as a :class:`Fix`, or None when it adds a blocking
        diagnostic, makes no progress or its edits do not apply."""
        try:
            splice = candidate.splice(document)
        except ValueError:
            return None
        text = splice.apply()
        if text == document:
            return None
        # The fixer's own (attribute) checks re-read the whole file (0.2 s on a 2,600-line one): only
        # for the fixes that can change what they find, an attribute's or an import's. What another fix
        # reveals is found at the chain's next step, which reads the fixed text with every check.
        after, skipped = self.diagnose(text, extra=candidate.kind in EXTRA_KINDS)
        failed = before_skipped | skipped
        before_kept = [d for d in before if d.source not in failed]
        after_kept = [d for d in after if d.source not in failed]
        introduced = introduced_diagnostics(before_kept, after_kept, splice)
        if any(is_syntax_error(d) for d in before_kept):
            if _no_words(document, candidate):
                # Indentation or punctuation in a document that did not parse: a name's finding in the
                # lines it touched was there, unseen (``introduced`` excuses only those outside the edit).
                introduced = [d for d in introduced if is_syntax_error(d)]
            # The compiler stops at the first error: one past the edit was there, unseen, too.
            index, edited_end = LineIndex(text), splice.start + len(splice.text)
            introduced = [d for d in introduced if not (is_syntax_error(d) and index.offset(d.line, d.col) >= edited_end)]
        if any(d.severity in self.severities for d in introduced):
            return None
        if not progress(before_kept, after_kept, splice, self.severities):
            return None
        return Fix(candidate.title, text, candidate.kind, candidate.source, after, introduced,
                   candidate.edit_cost(document), candidate.safe, order=candidate.order)


_WORD = re.compile(r"\w")


def _no_words(document: str, candidate: Candidate) -> bool:
    """Whether ``candidate`` only moves white space and punctuation (it cannot create or remove a name)."""
    return not any(_WORD.search(e.text) or _WORD.search(document[e.start:e.end]) for e in candidate.edits)


def ranked(fixes: Sequence[Fix], severities: Sequence[str] = BLOCKING) -> list[Fix]:
    """``fixes`` best first, one per fixed text (the better-ranked title kept), the first preferred."""
    best: dict[str, Fix] = {}
    for fix in sorted(fixes, key=lambda f: rank_key(f, severities)):
        best.setdefault(fix.text, fix)
    out = list(best.values())
    for fix in out:
        fix.preferred = False
    if out:
        out[0].preferred = True
    return out
