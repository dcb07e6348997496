"""The model-free fixer: candidates from the parsers, ruff and the names, judged, ranked, chained.

:meth:`QuickFixer.fixes` diagnoses the code once, asks every generator for candidates (syntax
errors first: while the code does not parse the other checkers see little), judges each
(:class:`~glm5_lsp.quickfix.rank.Checks`) and ranks what is kept. Where the best fix leaves
blocking diagnostics, whether the file had them or the repaired parse revealed them, the fixer
goes on from its text (a file with two errors), up to ``max_steps`` fixes, and offers the chain as
one more candidate titled by its steps. It stops at the deadline: candidates not judged by then are
dropped, never returned unjudged.

Given ``lines`` (where the user asked, in the editor), the first step fixes only diagnostics on
those lines, and a chain goes on only to what that fix revealed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from glm5_lsp.checks.introduced import is_syntax_error
from glm5_lsp.checks.providers.runner import DiagnosticRunner
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.quickfix import imports, names
from glm5_lsp.quickfix.edits import Candidate, Edit
from glm5_lsp.quickfix.parser import syntax_candidates
from glm5_lsp.quickfix.rank import BLOCKING, Checks, Fix, rank_key, ranked
from glm5_lsp.quickfix.ruff import ruff_candidates
from glm5_lsp.textdiff import diff_region

log = logging.getLogger(__name__)

DEFAULT_SECONDS = 2.0  # the fixer's whole time when the caller gives none
MAX_STEPS = 6  # fixes chained one after another
PREFILTER = 24  # syntax candidates that pass the compile-only check and are judged in full, at most
FOLLOW_UPS = 6  # candidates stopped at a second error on their own line, followed by its fixes (``_followed``)


class QuickFixer:
    """Model-free fixes of one document (``path`` and ``language`` choose the checkers' rules)."""

    def __init__(self, runner: DiagnosticRunner, path: str, language: str, *, seconds: float = DEFAULT_SECONDS,
                 max_steps: int = MAX_STEPS, severities: Sequence[str] = BLOCKING,
                 attribute_seconds: float = 0.5, should_cancel: Callable[[], bool] | None = None) -> None:
        self.runner = runner
        self.path = path
        self.language = language
        self.seconds = seconds
        self.max_steps = max_steps
        self.severities = tuple(severities)
        self.attribute_seconds = attribute_seconds
        self.should_cancel = should_cancel
        extra = (lambda text: names.attribute_problems(text, path, attribute_seconds)) if language == "python" else None
        self.checks = Checks(runner, path, language, extra, severities)
        self._compile = next((p for p in runner.providers if p.name == "compile" and language in p.languages), None)
        self._deadline = 0.0

    # ---- the entry points ----------------------------------------------------------------

    def fixes(self, code: str, lines: Sequence[int] | None = None) -> list[Fix]:
        """The ranked fixes of ``code`` (the best first, marked preferred); [] when it has no
        blocking diagnostic or nothing helps."""
        if self.language == "python":
            imports.warm()  # once a process (about 0.3 s): not the fix's time, every later fix has it
        started = time.monotonic()
        self._deadline = started + self.seconds
        before, skipped = self.checks.diagnose(code)
        if not self._blocking(before):
            return []
        wanted = set(lines) if lines else None
        singles = self._step(code, before, skipped, wanted)
        out = list(singles)
        for first in singles[:2]:  # the best one or two single fixes, carried on where they leave work
            chain = self._chain(code, first, before, wanted)
            if chain is not None:
                out.append(chain)
            if self._late():
                break
        result = ranked(out, self.severities)
        seconds = time.monotonic() - started
        for fix in result:
            fix.seconds = seconds
        return result

    def best(self, code: str, lines: Sequence[int] | None = None) -> Fix | None:
        found = self.fixes(code, lines)
        return found[0] if found else None

    # ---- one step ----------------------------------------------------------------------------

    def _step(self, code: str, before: list[Diagnostic], skipped: frozenset[str],
              wanted: set[int] | None) -> list[Fix]:
        """Every candidate for the blocking diagnostics of ``code`` (on ``wanted`` lines, if given),
        judged; the kept ones ranked."""
        targets = [d for d in self._blocking(before) if wanted is None or d.line in wanted]
        if not targets:
            return []
        syntax = [d for d in targets if is_syntax_error(d)]
        candidates: list[Candidate] = []
        if syntax:
            # While the code does not parse, only syntax fixes: the other findings are unreliable.
            candidates = self._prefilter(code, _proposed(syntax_candidates, code, syntax, self.language))
        elif self.language == "python":
            candidates += _proposed(names.name_candidates, code, targets, self.path)
            candidates += _proposed(names.attribute_candidates, code, targets, self.attribute_seconds)
            from_ruff = _proposed(ruff_candidates, code, targets, self.path)
            candidates += from_ruff + _proposed(_unused_imports, code, targets, from_ruff)
        kept = []
        for candidate in candidates:
            if self._late():
                break
            fix = self.checks.judge(code, candidate, before, skipped)
            if fix is not None:
                kept.append(fix)
        return ranked(kept, self.severities)

    def _prefilter(self, code: str, candidates: list[Candidate]) -> list[Candidate]:
        """The syntax candidates whose text gets past the point of the error under the compiler alone
        (a fraction of a millisecond each, where the full checks take a few): it compiles, or its
        first error lies after the candidate's last edited line. Where none does, the candidates that
        stopped at a second error on their own line, each followed by a fix of that one
        (:meth:`_followed`). Other languages: all of them."""
        if self._compile is None:
            return candidates
        kept: list[Candidate] = []
        stuck: list[tuple[Candidate, str, list[Diagnostic]]] = []
        for candidate in candidates:
            if len(kept) >= PREFILTER or self._late():
                break
            try:
                text = candidate.apply(code)
            except ValueError:
                continue
            passed, errors = self._gets_past(candidate, text)
            if passed:
                kept.append(candidate)
            elif errors and len(stuck) < FOLLOW_UPS:
                stuck.append((candidate, text, errors))
        return kept or self._followed(code, stuck)

    def _gets_past(self, candidate: Candidate, text: str) -> tuple[bool, list[Diagnostic]]:
        """Whether ``text`` (``candidate`` applied) compiles or first fails after the candidate's last
        edited line; and the compiler's errors at or above that line. (A compiler that fails: passed,
        for the full checks to judge.)"""
        assert self._compile is not None
        try:
            errors = self._compile.diagnose(text, self.path, self.language)
        except Exception:  # the full check will say what is wrong; judge it there
            log.debug("compile check failed", exc_info=True)
            return True, []
        last_line = max(text.count("\n", 0, e.start + len(e.text)) for e in _shifted(candidate))
        early = [e for e in errors if e.line <= last_line]
        return not early, early

    def _followed(self, code: str, stuck: list[tuple[Candidate, str, list[Diagnostic]]]) -> list[Candidate]:
        """Two errors on one line, where mending either alone stops at the other (``print('total:``
        leaves a string and a bracket open; ``if a = 0 and b = 1:`` has two ``=``): each candidate
        that stopped so, followed by the syntax candidates for the error it stopped at, kept as one
        candidate where the two together get past the line."""
        out: list[Candidate] = []
        seen: set[str] = set()
        for first, text, errors in stuck:
            for second in _proposed(syntax_candidates, text, errors, self.language):
                if len(out) >= PREFILTER or self._late():
                    return out
                try:
                    final = second.apply(text)
                except ValueError:
                    continue
                if final in seen:
                    continue
                seen.add(final)
                both = _merged(code, first, text, second, final)
                passed, _ = self._gets_past(both, final)
                if passed:
                    out.append(both)
        return out

    # ---- chains -------------------------------------------------------------------------------

    def _chain(self, code: str, first: Fix, original: list[Diagnostic], wanted: set[int] | None) -> Fix | None:
        """``first`` followed by the best next fix, again and again, while blocking diagnostics
        remain and each step makes progress. None when no second step helps."""
        current = first
        steps = [first.title]
        known = {d.key() for d in original}
        for _ in range(self.max_steps - 1):
            if not current.blocking(self.severities) or self._late():
                break
            after, skipped = self.checks.diagnose(current.text)
            lines = None
            if wanted is not None:  # only what the first fix revealed, or the lines asked about
                lines = {d.line for d in after if d.key() not in known or d.line in wanted}
                if not lines:
                    break
            following = self._step(current.text, after, skipped, lines)
            if not following:
                break
            step = following[0]
            steps.append(step.title)
            current = Fix(step.title, step.text, "several", step.source, step.diagnostics,
                          current.introduced + step.introduced, current.cost + step.cost,
                          current.safe and step.safe, order=first.order)
        if len(steps) < 2:
            return None
        current.title = _chain_title(steps)
        current.steps = tuple(steps)
        return current

    # ---- helpers -----------------------------------------------------------------------------

    def _blocking(self, diagnostics: Sequence[Diagnostic]) -> list[Diagnostic]:
        return [d for d in diagnostics if d.severity in self.severities]

    def _late(self) -> bool:
        if self.should_cancel is not None and self.should_cancel():
            return True
        return time.monotonic() > self._deadline


def _unused_imports(code: str, targets: list[Diagnostic], from_ruff: list[Candidate]) -> list[Candidate]:
    """Unused imports ruff has no fix for (in ``__init__.py`` an import may be a re-export, so
    removing it is offered as an unsafe fix, after any other)."""
    fixed_lines = {line for candidate in from_ruff if candidate.kind == "lint" for line in candidate.targets}
    left = [d for d in targets if d.line not in fixed_lines]
    return [Candidate(f"Remove unused import: `{name}`", (edit,), "lint", "names", safe=False, targets=(line,))
            for name, edit, line in imports.unused_import_edits(code, left)]


def _proposed(generator: Callable[..., list[Candidate]], *args: object) -> list[Candidate]:
    """A generator's candidates; none when it fails (a fix it cannot propose is no reason to fail
    the request: the model, or the other generators, may still fix the code)."""
    try:
        return generator(*args)
    except Exception:
        log.exception("%s failed; its fixes are left out", getattr(generator, "__name__", "a fix generator"))
        return []


def _merged(code: str, first: Candidate, text: str, second: Candidate, final: str) -> Candidate:
    """``first`` (``code`` -> ``text``) then ``second`` (``text`` -> ``final``) as one candidate on
    ``code``: one edit over the span where ``code`` and ``final`` differ, costing what the two cost."""
    edit = Edit(*diff_region(code, final))
    return Candidate(f"{first.title}; {second.title}", (edit,), first.kind,
                     first.source, first.safe and second.safe, first.order + second.order,
                     first.edit_cost(code) + second.edit_cost(text), tuple(sorted({*first.targets, *second.targets})))


def _shifted(candidate: Candidate) -> list[_Placed]:
    """Each edit of ``candidate`` where it lands in the edited text (earlier edits move later ones)."""
    placed = []
    shift = 0
    for edit in sorted(candidate.edits, key=lambda e: e.start):
        placed.append(_Placed(edit.start + shift, edit.text))
        shift += len(edit.text) - (edit.end - edit.start)
    return placed


class _Placed:
    __slots__ = ("start", "text")

    def __init__(self, start: int, text: str) -> None:
        self.start = start
        self.text = text


def _chain_title(steps: list[str]) -> str:
    if len(steps) <= 3:
        return "; ".join(steps)
    return f"{'; '.join(steps[:2])} and {len(steps) - 2} more fixes"


__all__ = ["Fix", "QuickFixer", "rank_key"]
