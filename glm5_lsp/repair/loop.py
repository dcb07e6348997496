"""The repair loop: generate -> splice -> diagnose -> (hints + error spans) -> regenerate.

Round 1 sends the caller's request unchanged. Each candidate (after the caller's ``postprocess``
and the ``rewriters`` -- style fixes, exception-template fill -- each kept only if it adds no
blocking diagnostic) is spliced into the document and judged "introduced only"
(``glm5_lsp.checks.introduced``). If it adds a diagnostic of a blocking severity, the next round's
prompt is ``repair_prompt.build_repair_prompt``: the hints as a comment block just before the
cursor line plus ``error_context`` spans on the block and on the offending lines the prompt shows
(forced full attention in the runtime); later rounds sample at ``repair_temperature`` so a repeated
mistake is not reproduced token for token. With ``max_truncations``, an unclean candidate's
prefixes that end at a plausible point are judged first (``truncate``): a clean one is returned
rather than waiting for another generation. The loop stops at the first clean candidate, after
``max_rounds`` generations, or when ``time_budget_s`` is spent (the running generation is cancelled
through ``should_cancel`` at the deadline). If none is clean, such a completion may still finish the
word typed at the cursor from the names around it (``finisher``, ``glm5_lsp.pynames.words``), judged
the same way. Such completions also get the ``word_check``: a candidate that finishes the typed word
as a name nothing binds is unclean ("undefined name", source ``names``) even where the checkers see
no names because the document does not parse.

The best candidate is chosen by: no blocking diagnostic first, then fewer of them, then fewer style
breaks (``penalties``), then the higher mean log-probability per token. By default only a clean
candidate is returned (``text`` is None otherwise); ``return_unclean`` returns the best one with its
diagnostics attached. The model is reached only through ``Backend.complete``.
"""

from __future__ import annotations

import copy
import keyword
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from glm5_lsp.backends.base import (
    Backend,
    BackendError,
    CompletionRequest,
    LogitsProcessor,
    expect_word,
    set_time_left,
)
from glm5_lsp.checks.introduced import Judgement, Splice, is_syntax_error, judge
from glm5_lsp.checks.providers import DiagnosticRunner, default_runner
from glm5_lsp.checks.providers.runner import in_background
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.healing import healed_word
from glm5_lsp.postprocess import trailing_identifier
from glm5_lsp.repair.repair_prompt import RepairContext, build_repair_prompt, hint_lines
from glm5_lsp.repair.stream import BlockWatch
from glm5_lsp.repair.truncate import cut_points, header_colon
from glm5_lsp.spans import Prompt

log = logging.getLogger(__name__)
WORD_CHECK_SOURCE = "names"  # the source of ``word_check``'s diagnostics


@dataclass
class RepairSettings:
    max_rounds: int = 3  # generations in all, the first one included
    time_budget_s: float = 30.0  # wall-clock for the whole loop; the generation running at the deadline is cancelled
    return_unclean: bool = False  # return the best candidate even if it adds blocking diagnostics
    blocking_severities: tuple[str, ...] = ("error", "warning")  # what makes a candidate unclean
    reject_empty: bool = True  # an empty (whitespace-only) candidate is not a clean answer
    max_hints: int = 5  # hint lines per repair prompt
    repair_temperature: float = 0.3  # sampling temperature of rounds 2+ (0 keeps greedy)
    provider_timeout_s: float = 10.0
    use_external_checkers: bool = True  # ruff, gcc/g++, node, go vet when installed
    monitor: bool | None = None  # decoding monitor: None = on for Python only, True/False = forced
    # An unclean candidate's prefixes (``truncate.cut_points``, longest first, at most this many
    # judged) are tried before regenerating; a clean one ends the loop. 0 disables (fix and
    # generate do: a body cut short is worse than none).
    max_truncations: int = 0

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds must be at least 1, got {self.max_rounds}")
        if self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s must be positive, got {self.time_budget_s}")

    def monitor_on(self, language: str) -> bool:
        return self.monitor if self.monitor is not None else language == "python"


@dataclass(frozen=True)
class RepairTarget:
    """Where the candidate goes: it replaces ``document[start:end]`` (an insertion when equal)."""

    document: str
    start: int
    end: int
    path: str
    language: str


@dataclass
class Candidate:
    text: str
    round: int
    introduced: list[Diagnostic]
    blocking: list[Diagnostic]
    logprob: float | None
    tokens: int
    penalty: int = 0  # style breaks and the like: ranks down, never blocks
    empty: bool = False
    truncated: bool = False  # a prefix of a generated candidate (``truncate.cut_points``)
    finished_word: bool = False  # not generated: the typed word finished from the names around it
    remembered: bool = False  # not generated: the workspace memory's continuation (``alternative``)
    vouched: bool = False  # the model and the workspace memory agree on it (``extension``)

    def mean_logprob(self) -> float:
        return -math.inf if self.logprob is None else self.logprob / max(self.tokens, 1)

    def rank(self, reject_empty: bool) -> tuple[int, int, int, int, float]:
        """Lower is better: clean first; among unclean ones, any text before an empty one (the best
        unclean candidate is returned where ``return_unclean`` asks for it, and nothing is no
        candidate), then fewer blocking diagnostics, fewer penalties, higher likelihood."""
        empty = reject_empty and self.empty
        unclean = bool(self.blocking) or empty
        return (int(unclean), int(empty), len(self.blocking), self.penalty, -self.mean_logprob())


@dataclass
class LoopTask:
    """What one request adds to the loop's rules: how a raw completion becomes a candidate
    (``postprocess``), how its stream is watched (``watch``: :class:`~glm5_lsp.repair.stream.BlockWatch`),
    and its own limits (None: the loop's settings)."""

    postprocess: Callable[[str], str] | None = None
    watch: BlockWatch | None = None
    max_truncations: int | None = None
    time_budget_s: float | None = None


@dataclass
class RepairResult:
    text: str | None  # None when no acceptable candidate was found (see RepairSettings.return_unclean)
    clean: bool
    diagnostics_before: list[Diagnostic]  # the document's, without any candidate
    diagnostics_after: list[Diagnostic]  # the ones the returned text introduces
    rounds: int
    candidates_tried: int
    seconds: float
    tokens: int
    skipped_providers: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    finished_word: bool = False  # the text is the typed word finished from the names around it
    vouched: bool = False  # the model and the workspace memory agree on the text (``extension``)
    remembered: bool = False  # the text (or its end) is the workspace memory's, not generated
    prompt_tokens: int = 0  # over every round
    finish_reason: str = "stop"  # the last generation's
    recalled: Any = None  # what the workspace memory said at the cursor (``recall``), for the gate


Rewriter = Callable[[str, RepairTarget], "str | None"]  # a fixed candidate, or None for no change
WordFinisher = Callable[[str, str, str, str], "list[str]"]  # (before the word, the word, after, language) -> words
WordCheck = Callable[[str, str, str, str, str], str | None]  # (before, typed, text, after, language) -> unknown word
Penalty = Callable[[str, RepairTarget], int]
Warmer = Callable[[str, str, str], object]  # (document, language, path): reads what a rule will need
MonitorFactory = Callable[[RepairTarget], "LogitsProcessor | None"]
# The workspace memory's processor around the monitor (which may be None): (target, monitor) -> processor
MemoryFactory = Callable[[RepairTarget, "LogitsProcessor | None"], "LogitsProcessor | None"]
# A candidate that needs no model (the workspace memory's continuation, for a served model that gives
# no logits to mix it into): (request, target) -> text, or None
Alternative = Callable[[CompletionRequest, RepairTarget], "str | None"]
# The workspace memory's continuations (its token-level match, the project's other lines): the texts a
# clean first candidate may agree with or go on into; (request, target) -> texts
Extensions = Callable[[CompletionRequest, RepairTarget], "Sequence[str]"]


def _empty(text: str, forced: str) -> bool:
    """Nothing but whitespace beyond the forced (healed) prefix the request asked for."""
    return not (text[len(forced):] if forced and text.startswith(forced) else text).strip()


def typed_word(forced_prefix: str, target: RepairTarget) -> tuple[str, int]:
    """The word typed at the cursor and where it starts. Healed requests (``forced_prefix``) replace
    it, so candidates begin with it; otherwise candidates go in after it. A healed space is no word
    (``("", target.end)``)."""
    if forced_prefix:
        word = healed_word(forced_prefix)
        return word, target.start if word else target.end
    typed = trailing_identifier(target.document[: target.start])
    return typed, target.start - len(typed)


def statement_to_come(splice: Splice, blocking: Sequence[Diagnostic]) -> bool:
    """Whether what ``splice`` puts in (a keyword) only leaves its line's statement unfinished: each
    blocking problem it brings is a syntax error at or after the end of the text put in, where the
    parser ran out of line rather than met something wrong (``from os im`` -> ``from os import``,
    which waits for a name; ``el`` -> ``elif``, for a condition and a body; ``x = no`` -> ``x =
    not``). A keyword that cannot go there is an error at the keyword itself (``x = fo`` -> ``x =
    for``) and is not this."""
    spliced = splice.apply()
    end = splice.start + len(splice.text)
    end_line = spliced.count("\n", 0, end)
    end_col = end - (spliced.rfind("\n", 0, end) + 1)
    return bool(blocking) and all(is_syntax_error(d) and (d.line > end_line or (d.line == end_line and d.col >= end_col))
                                  for d in blocking)


class RepairLoop:
    """Regenerate-before-returning for one backend: a set of rules built once and run per request
    (:meth:`run` takes what the request adds, a :class:`LoopTask`); it keeps no request's state."""

    def __init__(self, backend: Backend, settings: RepairSettings | None = None,
                 runner: DiagnosticRunner | None = None, *, rewriters: Sequence[Rewriter] = (),
                 penalties: Sequence[Penalty] = (), monitor_factory: MonitorFactory | None = None,
                 finisher: WordFinisher | None = None,
                 word_check: WordCheck | None = None, clock: Callable[[], float] = time.monotonic,
                 memory_factory: MemoryFactory | None = None, alternative: Alternative | None = None,
                 extension: Extensions | None = None, agreed: Alternative | None = None,
                 warmers: Sequence[Warmer] = ()) -> None:
        self.backend = backend
        self.settings = settings or RepairSettings()
        self._runner = runner
        self.rewriters = list(rewriters)
        self.penalties = list(penalties)
        self.monitor_factory = monitor_factory
        self.finisher = finisher
        self.word_check = word_check
        self.clock = clock
        self.memory_factory = memory_factory  # mixing before the monitor (in-process model)
        self.alternative = alternative  # the memory's continuation, judged after an unclean first candidate
        self.extension = extension  # the memory's continuations, where they agree with a clean first candidate
        self.agreed = agreed  # the memory's answer where its views agree: shown without asking the model
        self.recall: Callable[[CompletionRequest, RepairTarget], Any] | None = None  # what the memory says there
        self._runners: dict[str, DiagnosticRunner] = {}  # per language, kept: providers keep recent parses
        self.warmers = list(warmers)  # what a rule reads from a whole document, read when it opens

    def warm(self, document: str, language: str, path: str = "") -> None:
        """Read ahead what the rules read from a whole ``document`` (its style conventions), so the
        first completion in a file just opened does not pay for it. Each warmer's failure is logged:
        the request then reads it itself."""
        for warmer in self.warmers:
            try:
                warmer(document, language, path)
            except Exception:
                log.warning("could not read %s ahead of the requests", path or "the document", exc_info=True)

    def runner_for(self, language: str) -> DiagnosticRunner:
        if self._runner is not None:
            return self._runner
        runner = self._runners.get(language)
        if runner is None:
            runner = default_runner(language, self.settings.provider_timeout_s, self.settings.use_external_checkers)
            self._runners[language] = runner
        return runner

    def run(self, request: CompletionRequest, target: RepairTarget, task: LoopTask | None = None) -> RepairResult:
        """The best candidate for ``request`` at ``target`` under the loop's rules and ``task``'s."""
        task = task or LoopTask()
        overrides = {k: v for k, v in (("max_truncations", task.max_truncations),
                                       ("time_budget_s", task.time_budget_s)) if v is not None}
        if overrides:  # this request's limits: the same rules over other settings
            rules = copy.copy(self)
            rules.settings = replace(self.settings, **overrides)
            return rules._run(request, target, task)
        return self._run(request, target, task)

    def _run(self, request: CompletionRequest, target: RepairTarget, task: LoopTask) -> RepairResult:
        settings = self.settings
        started = self.clock()
        deadline = started + settings.time_budget_s
        runner = self.runner_for(target.language)
        # The prompt's prefill first, where the backend can start it on a core of its own (the embedded
        # model's C path): it runs while the memory's line below and the processors' setup are worked out.
        prefetch = getattr(self.backend, "prefetch", None)
        if prefetch is not None and settings.max_rounds > 0:
            try:
                prefetch(request)
            except BackendError:
                log.debug("the prompt's prefetch failed; complete() prefills it", exc_info=True)
        # The document's own diagnostics are needed only to judge the first candidate: they are
        # computed while the model writes it (checkers are C code or subprocesses, torch releases
        # the GIL in its kernels, so the two overlap on a second core). Not before the memory's line
        # is worked out: the checkers' processes would take the core the prefill runs on.
        baseline_job = _Deferred(lambda: in_background(runner.diagnose, target.document, target.path,
                                                       target.language, name="repair-baseline"))
        candidates: list[Candidate] = []
        tokens = prompt_tokens = 0
        finish_reason = "stop"
        if self.agreed is not None and settings.max_truncations > 0 and "\n" in request.stop:
            early = self._agreed(request, target, runner, baseline_job, task)
            if early is not None:  # the workspace answers this line twice over: no generation needed
                baseline = baseline_job.result()
                result = self._result([early], baseline.diagnostics, list(baseline.skipped), started, 0)
                result.finish_reason = "memory"
                result.recalled = self._recalled(request, target)
                return result
        baseline_job.start()
        current = request
        finishing_tried = False  # the word finisher (``_finish_word``) is asked once at most
        for round_no in range(1, settings.max_rounds + 1):
            if round_no > 1 and (self.clock() >= deadline or (request.should_cancel and request.should_cancel())):
                break  # out of time, or the caller cancelled (a newer keystroke): no further round
            try:
                prepared = self._prepare(current, target, deadline)
                completion = (task.watch.complete(self.backend, prepared) if task.watch is not None
                              else self.backend.complete(prepared))
            except BackendError:
                if not candidates:
                    raise
                log.warning("repair round %d: the backend failed; keeping the candidates so far", round_no,
                            exc_info=True)
                break
            if round_no == 1:
                baseline = baseline_job.result()
                before = baseline.diagnostics
                skipped = list(baseline.skipped)
            tokens += completion.completion_tokens
            prompt_tokens += completion.prompt_tokens
            finish_reason = completion.finish_reason
            text = task.postprocess(completion.text) if task.postprocess else completion.text
            text, verdict = self._judge_with_rewrites(text, target, runner, before, baseline.skipped)
            skipped += [s for s in verdict.skipped if s not in skipped]
            blocking = (verdict.blocking(settings.blocking_severities)
                        or self._word_problem(text, request.forced_prefix, target))
            candidate = Candidate(text, round_no, verdict.introduced, blocking, completion.logprob,
                                  completion.completion_tokens, sum(p(text, target) for p in self.penalties),
                                  empty=_empty(text, request.forced_prefix))
            candidates.append(candidate)
            if not candidate.rank(settings.reject_empty)[0]:
                if round_no == 1 and self.extension is not None and settings.max_truncations > 0:
                    longer = self._extend(candidate, completion.text, request, target, runner, before,
                                          baseline.skipped, task)
                    if longer is not None:
                        candidates.insert(0, longer)  # equal in rank to the model's: the first one wins
                break
            if round_no == 1 and self.alternative is not None and settings.max_truncations > 0:
                # The memory's continuation (a served model's extra candidate): one check, where
                # another round costs a generation.
                remembered = self._alternative(request, target, runner, before, baseline.skipped, task)
                if remembered is not None:
                    candidates.append(remembered)
                    if not remembered.rank(settings.reject_empty)[0]:
                        break
            if self.finisher is not None and blocking and all(d.source == WORD_CHECK_SOURCE for d in blocking):
                break  # only the typed word is wrong: its finished form is cheaper than another generation
            shorter = self._shorten(candidate, target, runner, before, baseline.skipped, request.forced_prefix,
                                    deadline)
            if shorter is not None:
                candidates.append(shorter)
                break
            if round_no < settings.max_rounds and not finishing_tried:
                # As-you-type: the typed word finished from the names around it costs a check or two,
                # another generation a prompt's prefill and its decoding; the cheaper clean answer first.
                finishing_tried = True
                finished = self._finish_word(request, target, runner, before, baseline.skipped, deadline)
                if finished is not None:
                    candidates.append(finished)
                    break
            current = self._repair_request(request, candidate, verdict, target, round_no + 1)
        if not finishing_tried and all(c.rank(settings.reject_empty)[0] for c in candidates):
            finished = self._finish_word(request, target, runner, before, baseline.skipped, deadline)
            if finished is not None:
                candidates.append(finished)
        result = self._result(candidates, before, skipped, started, tokens)
        result.prompt_tokens, result.finish_reason = prompt_tokens, finish_reason
        result.recalled = self._recalled(request, target)
        return result

    def _recalled(self, request: CompletionRequest, target: RepairTarget) -> Any:
        if self.recall is None or self.settings.max_truncations <= 0:
            return None
        try:
            return self.recall(request, target)
        except Exception:  # the memory must never cost the user the model's answer
            log.exception("the memory's recollection failed")
            return None

    # ---- steps ------------------------------------------------------------------------------

    def _prepare(self, request: CompletionRequest, target: RepairTarget, deadline: float) -> CompletionRequest:
        """The request with the monitor attached and the deadline folded into ``should_cancel``."""
        outer = request.should_cancel

        def should_cancel() -> bool:
            return self.clock() >= deadline or bool(outer and outer())

        processor = request.logits_processor
        if processor is None:
            if self.monitor_factory is not None and self.settings.monitor_on(target.language):
                processor = self.monitor_factory(target)
                if processor is not None and healed_word(request.forced_prefix):
                    expect_word(processor, request.forced_prefix)  # the healed word is checked as a name too
                set_time_left(processor, lambda: deadline - self.clock())  # its lookups end by the deadline
            if self.memory_factory is not None and self.settings.max_truncations > 0:
                # Completions only (a fix or a body must not copy the code it replaces): the
                # memory's mixing first, then the monitor (``memory.mixing``).
                processor = self.memory_factory(target, processor)
        # The same deadline as an instant of time.monotonic() (the loop's clock may be a test's), for
        # backends that wait on a server: their retries and the circuit breaker go by it.
        until = time.monotonic() + max(0.0, deadline - self.clock())
        if request.deadline is not None:
            until = min(until, request.deadline)
        return replace(request, should_cancel=should_cancel, logits_processor=processor, deadline=until)

    def _judge_with_rewrites(self, text: str, target: RepairTarget, runner: DiagnosticRunner,
                             before: list[Diagnostic], before_skipped: list[str]) -> tuple[str, Judgement]:
        verdict = judge(Splice(target.document, target.start, target.end, text), runner, target.path,
                        target.language, before, before_skipped)
        blocking = len(verdict.blocking(self.settings.blocking_severities))
        for rewrite in (self._header_colon, *self.rewriters):
            fixed = rewrite(text, target)
            if fixed is None or fixed == text:
                continue
            fixed_verdict = judge(Splice(target.document, target.start, target.end, fixed), runner,
                                  target.path, target.language, before, before_skipped)
            fixed_blocking = len(fixed_verdict.blocking(self.settings.blocking_severities))
            if fixed_blocking <= blocking:
                text, verdict, blocking = fixed, fixed_verdict, fixed_blocking
        return text, verdict

    def _shorten(self, candidate: Candidate, target: RepairTarget, runner: DiagnosticRunner,
                 before: list[Diagnostic], before_skipped: list[str], forced: str,
                 deadline: float = math.inf) -> Candidate | None:
        """The longest clean prefix among ``max_truncations`` of the candidate's cut points: the
        longest ones and the shortest (the first word). Past the ``deadline`` only the first word is
        still tried (each try is a whole check of the document)."""
        if candidate.empty or self.settings.max_truncations <= 0:
            return None
        minimum = len(forced) + 1 if candidate.text.startswith(forced) else 1
        points = cut_points(candidate.text, target.language, minimum)
        budget = self.settings.max_truncations
        if len(points) > budget:  # the longest ones, and the first word (most often right)
            points = points[: budget - 1] + points[-1:]
        for number, length in enumerate(points):
            if number < len(points) - 1 and self.clock() >= deadline:
                continue
            # No colon for a cut header: the model meant it to go on (``if x`` + `` in xs:``).
            found = self.clean_form(candidate.text[:length], target, forced=forced, close_header=False,
                                    runner=runner, before=before, before_skipped=before_skipped)
            if found is None:
                continue
            text, verdict = found
            share = length / max(len(candidate.text), 1)  # the log-probability of the kept part, roughly
            return Candidate(text, candidate.round, verdict.introduced, [],
                             None if candidate.logprob is None else candidate.logprob * share,
                             max(1, round(candidate.tokens * share)), sum(p(text, target) for p in self.penalties),
                             truncated=True)
        return None

    @staticmethod
    def _header_colon(text: str, target: RepairTarget) -> str | None:
        return header_colon(text, target.document, target.start, target.end, target.language)

    def clean_form(self, text: str, target: RepairTarget, *, forced: str = "", check_word: bool = True,
                   close_header: bool = True, runner: DiagnosticRunner | None = None,
                   before: list[Diagnostic] | None = None,
                   before_skipped: Sequence[str] = (), incomplete_ok: bool = False) -> tuple[str, Judgement] | None:
        """``text`` as a model-free cut or word at ``target`` (with ``close_header``, its block header's
        colon added where the line needs one, ``truncate.header_colon``) and its verdict, when it
        blocks nothing, says more than the ``forced`` prefix and (``check_word``) finishes the typed
        word as a known name; None otherwise. One check, two where the colon is tried first; the
        document's own diagnostics (``before``) are computed when not given. ``incomplete_ok``: a
        word (a keyword) may leave its statement waiting for the rest of the line
        (:func:`statement_to_come`)."""
        runner = runner or self.runner_for(target.language)
        closed = self._header_colon(text, target) if close_header else None
        for form in (closed, text) if closed else (text,):
            splice = Splice(target.document, target.start, target.end, form)
            verdict = judge(splice, runner, target.path, target.language, before, before_skipped)
            blocking = verdict.blocking(self.settings.blocking_severities)
            if blocking and not (incomplete_ok and statement_to_come(splice, blocking)):
                continue
            if _empty(form, forced):
                continue
            if check_word and self._word_problem(form, forced, target):
                continue
            return form, verdict
        return None

    def _extend(self, candidate: Candidate, written: str, request: CompletionRequest, target: RepairTarget,
                runner: DiagnosticRunner, before: list[Diagnostic], before_skipped: list[str],
                task: LoopTask) -> Candidate | None:
        """Where one of the memory's continuations (``extension``) is what the model wrote (``written``,
        before post-processing), the two agree (``candidate.vouched``); where one goes on from it (the
        model stopped where it was unsure and the workspace says more), that longer text
        post-processed and judged like any candidate: the first clean one is returned."""
        assert self.extension is not None
        try:
            remembered = [text for text in self.extension(request, target) if text]
        except Exception:  # the memory must never cost the user the model's answer
            log.exception("the memory's continuation failed")
            return None
        written = written.split("\n", 1)[0] if "\n" in request.stop else written
        if not written.strip():
            return None
        longer = [text for text in remembered if text.startswith(written)]
        if any(text.rstrip() == written.rstrip() for text in longer):
            candidate.vouched = True
            return None
        for text in longer:
            text = task.postprocess(text) if task.postprocess else text
            if not text.startswith(candidate.text.rstrip(")]}\"' ")):
                continue
            text, verdict = self._judge_with_rewrites(text, target, runner, before, before_skipped)
            if verdict.blocking(self.settings.blocking_severities) or self._word_problem(text, request.forced_prefix,
                                                                                        target):
                continue
            return Candidate(text, candidate.round, verdict.introduced, [], candidate.logprob, candidate.tokens,
                             sum(p(text, target) for p in self.penalties), remembered=True, vouched=True)
        return None

    def _agreed(self, request: CompletionRequest, target: RepairTarget, runner: DiagnosticRunner,
                baseline_job: Any, task: LoopTask) -> Candidate | None:
        """The memory's answer that needs no model (``agreed``), post-processed and judged: returned
        when clean, vouched (its two views agree, which on held-out code is right most of the time)."""
        assert self.agreed is not None
        text = self._ask(self.agreed, request, target, "the memory's agreed answer")
        if not text:
            return None
        baseline = baseline_job.result()
        candidate = self._judged(text, 0, request, target, runner, baseline.diagnostics, baseline.skipped, task)
        if candidate is None or candidate.blocking:
            return None
        candidate.vouched = True
        return candidate

    def _alternative(self, request: CompletionRequest, target: RepairTarget, runner: DiagnosticRunner,
                     before: list[Diagnostic], before_skipped: list[str], task: LoopTask) -> Candidate | None:
        """The model-free candidate (``alternative``), post-processed and judged like the model's;
        None when there is none."""
        assert self.alternative is not None
        text = self._ask(self.alternative, request, target, "the memory's candidate")
        return self._judged(text, 1, request, target, runner, before, before_skipped, task) if text else None

    @staticmethod
    def _ask(hook: Alternative, request: CompletionRequest, target: RepairTarget, what: str) -> str | None:
        try:
            return hook(request, target)
        except Exception:  # the memory must never cost the user the model's answer
            log.exception("%s failed", what)
            return None

    def _judged(self, text: str, round_no: int, request: CompletionRequest, target: RepairTarget,
                runner: DiagnosticRunner, before: list[Diagnostic], before_skipped: list[str],
                task: LoopTask) -> Candidate | None:
        """A model-free text as a candidate: post-processed and judged like a generated one (its
        blocking diagnostics on it); None when nothing is left of it."""
        text = task.postprocess(text) if task.postprocess else text
        if _empty(text, request.forced_prefix):
            return None
        text, verdict = self._judge_with_rewrites(text, target, runner, before, before_skipped)
        blocking = (verdict.blocking(self.settings.blocking_severities)
                    or self._word_problem(text, request.forced_prefix, target))
        return Candidate(text, round_no, verdict.introduced, blocking, None, 0,
                         sum(p(text, target) for p in self.penalties), remembered=True)

    def _finish_word(self, request: CompletionRequest, target: RepairTarget, runner: DiagnosticRunner,
                     before: list[Diagnostic], before_skipped: list[str], deadline: float) -> Candidate | None:
        """No generated candidate is clean: :meth:`finish_word`, as-you-type completions only (those
        that may be cut short, ``max_truncations``)."""
        if self.settings.max_truncations <= 0:
            return None
        return self.finish_word(request.forced_prefix, target, runner=runner, before=before,
                                before_skipped=before_skipped, deadline=deadline)

    def finish_word(self, forced_prefix: str, target: RepairTarget, *, runner: DiagnosticRunner | None = None,
                    before: list[Diagnostic] | None = None, before_skipped: Sequence[str] = (),
                    deadline: float = math.inf, tries: int | None = None) -> Candidate | None:
        """The word typed at the cursor finished from the names around it (``finisher``, likeliest
        first, at most ``tries`` of them), the first clean one (:meth:`clean_form`) as insertion text
        at ``target`` (the healed ``forced_prefix`` included when there is one); past the
        ``deadline`` only the likeliest is tried. None when nothing finishes it cleanly."""
        if self.finisher is None:
            return None
        document = target.document
        typed, word_start = typed_word(forced_prefix, target)  # a healed space is no word
        if not typed:
            return None
        words = self.finisher(document[:word_start], typed, document[target.end:], target.language)
        for number, word in enumerate(words[:tries]):
            if number and self.clock() >= deadline:
                break
            text = word if forced_prefix else word[len(typed):]
            found = self.clean_form(text, target, forced=forced_prefix, check_word=False, runner=runner,
                                    before=before, before_skipped=before_skipped,
                                    incomplete_ok=target.language == "python" and keyword.iskeyword(word))
            if found is not None:
                text, verdict = found
                return Candidate(text, 0, verdict.introduced, [], None, 0, sum(p(text, target) for p in self.penalties),
                                 finished_word=True)
        return None

    def _word_problem(self, text: str, forced_prefix: str, target: RepairTarget) -> list[Diagnostic]:
        """``word_check``'s verdict on the word the candidate finishes at the cursor, as a blocking
        diagnostic ("undefined name") there; as-you-type completions only (``max_truncations``)."""
        if self.word_check is None or self.settings.max_truncations <= 0:
            return []
        typed, word_start = typed_word(forced_prefix, target)
        if not typed:
            return []
        rest = text[len(typed):] if forced_prefix and text.startswith(typed) else text
        document = target.document
        word = self.word_check(document[:word_start], typed, rest, document[target.end:], target.language)
        if word is None:
            return []
        line = document.count("\n", 0, word_start)
        col = word_start - (document.rfind("\n", 0, word_start) + 1)
        return [Diagnostic(line, col, line, col + len(word), f"undefined name {word!r}: nothing in this file or "
                           "in scope binds it", "error", WORD_CHECK_SOURCE, "undefined-name")]

    def _repair_request(self, original: CompletionRequest, failed: Candidate, verdict: Judgement,
                        target: RepairTarget, round_no: int) -> CompletionRequest:
        problems = failed.blocking or failed.introduced
        hints = hint_lines(problems, verdict.spliced, self.settings.max_hints)
        if failed.empty and not problems:
            hints = ["the completion was empty; write the missing code"]
        where = RepairContext(target.document, target.start, target.end, failed.text, target.language)
        prompt: Prompt = build_repair_prompt(original.prompt, hints, problems, where)
        seed = None if original.seed is None else original.seed + round_no
        return replace(original, prompt=prompt, temperature=self.settings.repair_temperature or original.temperature,
                       seed=seed if seed is not None else round_no)

    def _result(self, candidates: list[Candidate], before: list[Diagnostic], skipped: list[str],
                started: float, tokens: int) -> RepairResult:
        reject_empty = self.settings.reject_empty
        best = min(candidates, key=lambda c: c.rank(reject_empty)) if candidates else None
        clean = best is not None and not best.rank(reject_empty)[0]
        returned = best if best is not None and (clean or self.settings.return_unclean) else None
        return RepairResult(
            text=returned.text if returned else None, clean=clean, diagnostics_before=list(before),
            diagnostics_after=list(returned.introduced) if returned else [],
            rounds=max((c.round for c in candidates), default=0), candidates_tried=len(candidates),
            seconds=self.clock() - started, tokens=tokens, skipped_providers=skipped, candidates=candidates,
            finished_word=returned is not None and returned.finished_word,
            vouched=returned is not None and returned.vouched,
            remembered=returned is not None and returned.remembered,
        )


class _Deferred:
    """A background job started on the first :meth:`start` or :meth:`result`."""

    def __init__(self, begin: Callable[[], Any]) -> None:
        self._begin = begin
        self._job: Any = None

    def start(self) -> None:
        if self._job is None:
            self._job = self._begin()

    def result(self) -> Any:
        self.start()
        return self._job.result()
