"""The one pipeline every front end calls: context -> backend -> post-processing -> repair.

The language server, ``glm5-lsp batch`` and ``glm5-lsp eval`` all go through :class:`Pipeline`, so
a change to prompt building, post-processing or repair lands everywhere at once. Three requests:

- :meth:`Pipeline.complete`: text to insert at a cursor in a document (single- or multi-line);
- :meth:`Pipeline.generate`: code for a signature plus docstring, or for an instruction;
- :meth:`Pipeline.fix`: the whole code, rewritten so its diagnostics go away.

Every candidate goes through the repair loop (``glm5_lsp.repair.loop``): spliced into the document,
checked, regenerated with the checkers' hints when it adds diagnostics. The prompt comes from the
context engine when one is given (``glm5_lsp.context``), else it is the code around the cursor.
Diagnostics in results are ``repair.Diagnostic`` as dicts: 0-based ``line``/``col``, ``message``,
``severity``, ``source``, ``code``.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from glm5_lsp.backends.base import Backend, BackendError, CompletionRequest, capabilities
from glm5_lsp.context.syntax import wants_multiline
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.healing import healed_text
from glm5_lsp.indentation import indent_unit, reindent
from glm5_lsp.languages import detect_language
from glm5_lsp.pipeline.gating import (
    StatsWatch,
    finished_word,
    judged,
    memory_line,
    memory_words,
    workspace_line,
)
from glm5_lsp.pipeline.memory import SessionMemory, wire_memory
from glm5_lsp.postprocess import cut_at_block_end, cut_at_stops, first_line, strip_special_tokens, tidy
from glm5_lsp.pynames.jedi import warm_jedi
from glm5_lsp.quickfix import Fix, QuickFixer
from glm5_lsp.quickfix import warm as warm_quick_fixes
from glm5_lsp.quickfix.rank import ranked as ranked_fixes
from glm5_lsp.repair.fix_region import (  # noqa: F401 (FixRegion, fix_region: re-exported)
    FixRegion,
    error_spans,
    first_diagnostic_line,
    fix_header,
    fix_region,
    keeps_enough,
    line_of,
    working_lines,
)
from glm5_lsp.repair.loop import LoopTask, RepairLoop, RepairSettings, RepairTarget
from glm5_lsp.repair.monitor import MonitorSettings
from glm5_lsp.repair.standard import standard_loop
from glm5_lsp.repair.stream import BlockWatch
from glm5_lsp.spans import Prompt, Span

log = logging.getLogger(__name__)

# Top-level starts that end a generated Python function body (the usual HumanEval stops).
PYTHON_BODY_STOPS: tuple[str, ...] = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
# After a whole program written for an instruction: the model starting to test or run it.
PYTHON_SCRIPT_STOPS: tuple[str, ...] = ("\nif __name__", "\nprint(", "\nassert ")
# An unsaved buffer's file name per language, for the checkers (which choose by extension).
_UNTITLED = {
    "python": ".py", "javascript": ".js", "typescript": ".ts", "tsx": ".tsx", "go": ".go", "rust": ".rs",
    "c": ".c", "cpp": ".cpp",
}


UNHURRIED_LOOKUP_S = 3.0  # the decoding monitor's name-lookup time per request in batch and evaluation


@dataclass
class PipelineSettings:
    """Knobs shared by every front end (the server maps its LSP settings onto these)."""

    max_tokens: int = 64  # single-line completions
    # Single-line completions stop at a token the model gives less than this probability, cut back to
    # where the last word or bracket ended (``GenerationConfig.min_token_prob``; the in-process
    # runtime only). 0: off.
    min_token_prob: float = 0.0
    # The prompt budget of a single-line completion (None: the context engine's own budget).
    line_context_tokens: int | None = None
    multiline_max_tokens: int = 256  # multi-line completions, generate and fix
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    max_prefix_chars: int = 6000  # plain prompt: code kept before the cursor
    max_suffix_chars: int = 2000  # plain prompt: code kept after the cursor
    use_attention_policy: bool = True
    # Token healing (where the backend supports it): a word the cursor sits at the end of, or the
    # space it follows with the token before it, is cut off the prompt and the model writes it
    # again in its own tokens (``glm5_lsp.healing``).
    token_healing: bool = True
    # Completions only: how many shorter prefixes of an unclean candidate are checked before
    # regenerating (``repair.truncate``); generate and fix never cut a body short.
    truncations: int = 3
    # Rounds, time budget, clean-only or best-unclean: max_rounds=1 checks without regenerating.
    repair: RepairSettings = field(default_factory=RepairSettings)
    # Batch and evaluation, where no one is typing: before each Python request jedi loads the
    # document's imports and parses it with no time limit (``pynames.jedi.warm_jedi``: 0.3-1 s for a
    # module's first load, then milliseconds), and the decoding monitor may spend up to
    # ``UNHURRIED_LOOKUP_S`` on name lookups per request instead of the 0.2 s sized for typing. At
    # 0.2 s the first lookup of a kind of object (``self.items.`` on a list) is cut off, and the
    # model writes after the dot unchecked. The server warms each document when it opens instead.
    unhurried: bool = False
    # Multi-line text re-expressed in the document's indentation unit (``glm5_lsp.indentation``)
    # before it is judged: what an editor inserts. Off for batch and eval, which keep the model's own.
    reindent: bool = False


@dataclass
class PipelineResult:
    """What a front end gets back: the text plus how it was checked and what it cost.

    ``text`` is what to insert at the cursor (complete), the body after a code prompt or the whole
    code for an instruction (generate), or the whole fixed code (fix); it is empty when no candidate
    passed the checks and ``settings.repair.return_unclean`` is off.
    """

    text: str
    clean: bool  # True when the text adds no blocking diagnostic to the document
    diagnostics_before: list[dict[str, Any]] = field(default_factory=list)  # the document's own
    # complete/generate: what the text introduces; fix: everything the returned code still has
    diagnostics_after: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 1
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    finish_reason: str = "stop"
    finished_word: bool = False  # no generated candidate was clean: the typed word finished from the names around it
    from_lines: bool = False  # the gate withheld the model's (or it had none): the workspace's lines' rest of the line
    # The model and the workspace memory agree on the text, or the memory's two views do
    # (``pipeline.memory``). The gate still judges it, knowing what the memory said (on
    # BENCHMARK_FIT such answers were exact 52% of the time, the model's others 4%).
    vouched: bool = False
    # The text is the workspace memory's, not the model's: its model-free answer, the end the memory
    # gave a stopped-short answer, or its continuation standing in for a withheld candidate
    # (``pipeline/gating.py``); the gate reads it (a generation's statistics are not the text's own).
    remembered: bool = False
    # An as-you-type completion judged by the gate (``complete(gated=True)``, ``pipeline/gating.py``): its
    # P(kept) (None: no gate), the features it read (for the acceptance log), and why the text is empty
    # when the gate withheld the candidate ("" otherwise).
    score: float | None = None
    features: dict[str, float] = field(default_factory=dict)
    withheld: str = ""
    # What the workspace memory said at the cursor (``pipeline.memory.Recollection``; None without
    # one): the gate's memory features read it.
    recalled: Any = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PromptBuilder(Protocol):
    """The part of ``glm5_lsp.context.engine.ContextEngine`` the pipeline uses."""

    def build_prompt(self, text: str, offset: int, *, path: str | None = None, language: str | None = None,
                     budget_tokens: int | None = None) -> Prompt: ...


# --------------------------------------------------------------------------------------------
# Request shape (the post-processing rules themselves live in glm5_lsp.postprocess)
# --------------------------------------------------------------------------------------------


def guess_language(path: str | None, default: str = "python") -> str:
    """The language of ``path`` as the context engine names it (``plaintext`` when unknown);
    ``default`` for a request that names no file."""
    return detect_language(path) if path else default


# --------------------------------------------------------------------------------------------
# The pipeline
# --------------------------------------------------------------------------------------------


def diagnostic_dict(diagnostic: Any) -> dict[str, Any]:
    """A diagnostic (``repair.Diagnostic`` or a caller's mapping) as a JSON-friendly dict."""
    if isinstance(diagnostic, dict):
        return dict(diagnostic)
    return asdict(diagnostic)


@dataclass
class _Task:
    """One request, reduced to what every mode shares."""

    prompt: Prompt
    target: RepairTarget  # where the candidate goes: document[start:end] is replaced by it
    multiline: bool
    stop: list[str]
    max_tokens: int
    block_prefix: str  # text whose last line sets the block indentation
    wrap: Callable[[str], str] | None = None  # a last touch on the text (a closing newline, ...)
    forced_prefix: str = ""  # token healing: every candidate begins with this (cut off the document)
    truncations: int = 0  # RepairSettings.max_truncations for this task
    time_budget_s: float | None = None  # RepairSettings.time_budget_s for this task (None: the loop's own)
    min_token_prob: float = 0.0  # CompletionRequest.min_token_prob
    step_stats: bool = False  # ask the backend for the runtime's per-step internals (the gate reads them)
    internals: Any = None  # what the last generation handed out then (``Completion.stats``)

    @property
    def suffix(self) -> str:
        return self.target.document[self.target.end:]


class Pipeline:
    """Context -> backend -> post-processing -> repair loop, one request at a time per call.

    Thread-safe as long as the backend is (the local backend holds one lock around the model).
    ``repair`` is a :class:`~glm5_lsp.repair.loop.RepairLoop` used as a template (its settings,
    diagnostic runner, rewriters, penalties and monitor); by default ``repair.assemble.standard_loop``
    over ``settings.repair`` (style fixes, exception templates, the decoding monitor for Python).
    """

    def __init__(
        self,
        backend: Backend,
        settings: PipelineSettings | None = None,
        context: PromptBuilder | None = None,
        repair: RepairLoop | None = None,
        memory: SessionMemory | None = None,
    ) -> None:
        self.backend = backend
        self.settings = settings or PipelineSettings()
        self.context = context
        self._repair = repair
        self._repair_lock = threading.Lock()
        self.gate: Any = None  # a ``glm5_lsp.gate.CompletionGate`` once :meth:`install_gate` ran
        self._memory: SessionMemory | None = None
        self.memory = memory

    @property
    def memory(self) -> SessionMemory | None:
        """The workspace memory (``pipeline.memory``): mixed into the in-process model's decoding,
        or one more candidate for a served model's completions. None: no memory."""
        return self._memory

    @memory.setter
    def memory(self, memory: SessionMemory | None) -> None:
        self._memory = memory
        if self._repair is not None:
            wire_memory(self._repair, self.backend, memory)

    @property
    def repair(self) -> RepairLoop:
        """The repair-loop template: the caller's, or ``standard_loop`` (built on first use, since the
        decoding monitor needs the local model's vocabulary and loading it is not free)."""
        if self._repair is None:
            with self._repair_lock:
                if self._repair is None:
                    monitor = MonitorSettings(provider_seconds=UNHURRIED_LOOKUP_S) if self.settings.unhurried else None
                    loop = standard_loop(self.backend, self.settings.repair, token_strings=self._token_strings(),
                                         monitor_settings=monitor)
                    wire_memory(loop, self.backend, self._memory)
                    self._repair = loop
        return self._repair

    def _token_strings(self) -> list[str] | None:
        if not self.backend.supports_internals:
            return None  # the monitor needs logits: only the in-process runtime has them
        try:
            tokenizer = capabilities(self.backend, with_tokenizer=True).tokenizer
        except BackendError:
            return None  # the model will not load: the request reports that itself
        return None if tokenizer is None else list(tokenizer.token_strings())

    def warm_document(self, document: str, path: str | None = None, language: str | None = None) -> None:
        """Read what the repair loop's rules take from a whole document (its style conventions) and
        check it when it opens, so its first completion does not (7 ms on average in a file's first
        request on FIT code, once a file: they are kept while its size stays close; the checks' first
        call starts their helper processes). ``language``: the LSP languageId, else the path's
        extension says. Never raises."""
        lang = detect_language(path, language)
        try:
            self.repair.warm(document, lang, path or "")
        except Exception:  # the loop could not be built (the model's vocabulary): the request reports it
            log.warning("could not prepare the repair loop for %s", path or "the document", exc_info=True)
        try:  # the checkers' helper processes started and the document's own diagnostics remembered, as
            # the first request's judging wants them (its baseline): 40-60 ms of that request otherwise
            self.repair.runner_for(lang).diagnose(document, path or default_path(lang), lang)
        except Exception:  # the request's own checks report what fails
            log.warning("could not check %s ahead of the requests", path or "the document", exc_info=True)

    # ---- public requests -----------------------------------------------------------------

    def complete(
        self,
        text: str,
        offset: int,
        *,
        path: str | None = None,
        language: str | None = None,
        multiline: bool | None = None,
        on_text: Callable[[str], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        time_budget_s: float | None = None,
        gated: bool = False,
        trigger: str | None = None,
    ) -> PipelineResult:
        """The text to insert at character ``offset`` of the document ``text``.

        ``time_budget_s`` replaces the repair loop's for this request (as-you-type completions are
        worth less the later they come); it counts from this call, the prompt's building included.
        ``gated``: an as-you-type completion, judged by the installed gate after the checks (empty,
        with ``withheld`` saying why, below ``completion.minQuality``); ``trigger`` ("automatic" or
        "invoked") is one of the gate's features.
        """
        started = time.perf_counter()
        if not 0 <= offset <= len(text):
            raise ValueError(f"offset {offset} outside the document (length {len(text)})")
        language = language or guess_language(path)
        before, after = text[:offset], text[offset:]
        if multiline is None:
            multiline = wants_multiline(text, offset, language)
        heal, target, whole_lines = self._cursor_target(text, offset, path, language)
        if heal:  # the model sees the document without the word and writes it again (forced)
            before = before[: -len(heal)]
            text, offset = before + after, offset - len(heal)
            if on_text is not None:
                on_text = _skipping(len(heal), on_text)
        settings = self.settings
        task = _Task(
            prompt=self._build_prompt(text, offset, path=path, language=language,
                                      budget_tokens=None if multiline else settings.line_context_tokens),
            target=target,
            multiline=multiline, stop=[] if multiline else ["\n"],
            max_tokens=settings.multiline_max_tokens if multiline else settings.max_tokens, block_prefix=before,
            forced_prefix=heal, truncations=settings.truncations, time_budget_s=time_budget_s,
            min_token_prob=0.0 if multiline else settings.min_token_prob,
        )
        if time_budget_s is not None:  # what building the prompt took is gone from the budget
            task.time_budget_s = max(1e-3, time_budget_s - (time.perf_counter() - started))
        if whole_lines:
            task.wrap = _end_line  # the cursor starts a line before existing code: the answer is whole lines
        gate = self.gate if gated else None
        if gate is not None:
            gate.begin()
            task.step_stats = gate.wants_internals
        result = self._run(task, on_text=on_text, should_cancel=should_cancel)
        if result.recalled is not None:  # the gate reads them beside the candidate, post-processed as it is
            result.recalled = result.recalled.tidied(functools.partial(self.postprocess, task=task))
        if heal:  # what goes in at the cursor: the candidate less the word already typed
            result.text = result.text[len(heal):] if result.text.startswith(heal) else ""
        if gate is not None:
            result = judged(gate, result, target.document, target.end, language=language, multiline=multiline,
                            trigger=trigger, heal=heal, unclean_shown=settings.repair.return_unclean,
                            finish=lambda: finished_word(self.repair, target, heal), internals=task.internals,
                            line=lambda shown: workspace_line(self.repair, target, shown.recalled, heal),
                            remembered=lambda shown: self._stand_in(heal, target, whole_lines, shown.recalled),
                            words=lambda shown: memory_words(self.repair, target, shown.recalled, heal))
        return result

    def stand_in_text(self, document: str, offset: int, recalled: Any, *, path: str | None = None,
                      language: str | None = None) -> str:
        """What the gating shows of the memory's continuation (``recalled``, a ``Recollection``) in place of
        a withheld single-line candidate at ``offset`` of ``document``: its first line post-processed as a
        candidate's is, less the typed word token healing writes again, where it adds no blocking
        diagnostic; "" for none. The gate's data (``gate.collect``) asks the same."""
        return self._stand_in(*self._cursor_target(document, offset, path, language or guess_language(path)),
                              recalled)

    def healed_word(self, document: str, offset: int, path: str | None = None, language: str | None = None) -> str:
        """The typed word a completion at ``offset`` writes again (token healing), "" for none."""
        return self._cursor_target(document, offset, path, language or guess_language(path))[0]

    def _stand_in(self, heal: str, target: RepairTarget, whole_lines: bool, recalled: Any) -> str:
        task = _Task(prompt=Prompt(prefix=""), target=target, multiline=False, stop=["\n"], max_tokens=0,
                     block_prefix=target.document[: target.start], wrap=_end_line if whole_lines else None,
                     forced_prefix=heal)
        return memory_line(self.repair, target, recalled, heal, tidy=lambda line: self.postprocess(line, task))

    def _cursor_target(self, document: str, offset: int, path: str | None,
                       language: str) -> tuple[str, RepairTarget, bool]:
        """Where a completion at ``offset`` goes: the typed word token healing writes again ("" for
        none), the target it replaces (the word typed at the cursor in the document as it is, so a
        candidate is judged against what the user has, not the document without the word, which breaks
        differently), and whether the answer must be whole lines (the cursor starts a line before code)."""
        before, after = document[:offset], document[offset:]
        whole_lines = (not before or before.endswith("\n")) and after[:1] not in ("", "\n", "\r")
        heal = healed_text(before, after) if self._can_heal() else ""
        target = RepairTarget(document, offset - len(heal), offset, path or default_path(language), language)
        return heal, target, whole_lines

    def _can_heal(self) -> bool:
        return self.settings.token_healing and capabilities(self.backend).forced_prefix

    def install_gate(self, gate: Any) -> None:
        """Judge as-you-type completions (``complete(gated=True)``) with ``gate``, a
        ``glm5_lsp.gate.CompletionGate``: its decoding observer goes in front of the monitor now."""
        gate.install(self)
        self.gate = gate

    def generate(
        self,
        prompt: str,
        *,
        language: str = "python",
        on_text: Callable[[str], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
    ) -> PipelineResult:
        """Code for a prompt.

        A code prompt (a signature plus docstring) is continued: the result is the body that follows
        it. An instruction in prose becomes a comment block the model continues: the result is the
        whole code.
        """
        path = default_path(language)
        stops = list(PYTHON_BODY_STOPS) if language == "python" else []
        if looks_like_code(prompt, language):
            document = prompt if prompt.endswith("\n") else prompt + "\n"
            task = _Task(
                prompt=Prompt(prefix=document), target=RepairTarget(document, len(document), len(document), path, language),
                multiline=True, stop=stops, max_tokens=self.settings.multiline_max_tokens, block_prefix=document,
                wrap=lambda text: text if working_lines(text) else "",  # comments alone are no body
            )
            return self._run(task, on_text=on_text, should_cancel=should_cancel)
        header = instruction_header(prompt, language)
        task = _Task(
            prompt=Prompt(prefix=header), target=RepairTarget(header, len(header), len(header), path, language),
            multiline=True, stop=list(PYTHON_SCRIPT_STOPS) if language == "python" else [], max_tokens=self.settings.multiline_max_tokens, block_prefix="",
            wrap=lambda text: text.strip("\n") + "\n" if working_lines(text) else "",  # comments alone are no code
        )
        return self._run(task, on_text=on_text, should_cancel=should_cancel)

    def fix(
        self,
        code: str,
        *,
        diagnostics: list[Any] | None = None,
        path: str | None = None,
        language: str | None = None,
        on_text: Callable[[str], None] | None = None,
        should_cancel: Callable[[], bool] | None = None,
        use_model: bool = True,
        time_budget_s: float | None = None,
        model_free: bool = True,
    ) -> PipelineResult:
        """The whole of ``code`` fixed: by the parsers, ruff and the names first, by the model only
        when they leave blocking diagnostics and time is left (``model_free=False``: the model
        alone, as fixes were made before the model-free ones existed; for comparisons).

        The model-free fixes (``glm5_lsp.quickfix``: :meth:`fixes` lists them) come first; the best,
        chained where one fix reveals the next, is returned when it leaves the code clean
        (``finish_reason`` ``"quickfix"``, no tokens). Otherwise the model rewrites the block at
        fault in what they left (:meth:`_model_fix`), shown the diagnostics still there, within what
        is left of ``time_budget_s`` (the repair settings' budget by default); ``use_model=False``
        stops before it. Given ``diagnostics`` with lines (the editor's, where the user asked), the
        model-free fixes answer those lines. When nothing is clean, the model-free fix that made
        progress comes back (``clean`` False), or the input unchanged (the model's best unclean
        rewrite with ``return_unclean``, when it leaves fewer blocking diagnostics).
        ``diagnostics_after`` lists every diagnostic of the returned code.
        """
        started = time.perf_counter()
        language = language or guess_language(path)
        path = path or default_path(language)
        runner = self.repair.runner_for(language)
        severities = self.repair.settings.blocking_severities
        budget = time_budget_s if time_budget_s is not None else self.repair.settings.time_budget_s
        given = [diagnostic_dict(d) for d in diagnostics] if diagnostics is not None else None
        if self.settings.unhurried and language == "python":
            warm_quick_fixes(code, path, imported_from=True)  # batch and eval: nobody waits, so jedi and the import index get their time
        fixer = QuickFixer(runner, path, language, seconds=min(QUICK_FIX_SECONDS, budget), severities=severities,
                           should_cancel=should_cancel)
        quick = fixer.best(code, lines=_asked_lines(given)) if model_free else None
        found = given if given is not None else \
            [diagnostic_dict(d) for d in fixer.checks.diagnose(code)[0] if d.source != QUICK_NAMES_SOURCE]
        if quick is not None and quick.clean(severities):
            return PipelineResult(
                text=quick.text, clean=True, diagnostics_before=found,
                diagnostics_after=[diagnostic_dict(d) for d in quick.diagnostics], rounds=0,
                seconds=time.perf_counter() - started, finish_reason="quickfix")
        base = quick.text if quick is not None else code
        left = budget - (time.perf_counter() - started)
        cancelled = should_cancel is not None and should_cancel()
        result: PipelineResult | None = None
        if use_model and left >= MIN_MODEL_FIX_S and not cancelled:
            hints = [diagnostic_dict(d) for d in fixer.checks.diagnose(base)[0]
                     if d.severity in severities and d.source != QUICK_NAMES_SOURCE]
            if given is not None:  # the caller's own hints (a test that fails) still hold; lines moved if the code did
                hints += [d for d in given if base == code or line_of(d) is None]
            result = self._model_fix(base, hints or (given or []), path=path, language=language, on_text=on_text,
                                     should_cancel=should_cancel, time_budget_s=left)
            if result.clean:
                result.diagnostics_before = found
                result.seconds = time.perf_counter() - started
                return result
        fallback = PipelineResult(text=base, clean=False, diagnostics_before=found,
                                  diagnostics_after=[diagnostic_dict(d) for d in fixer.checks.diagnose(base)[0]],
                                  rounds=0 if result is None else result.rounds,
                                  prompt_tokens=0 if result is None else result.prompt_tokens,
                                  completion_tokens=0 if result is None else result.completion_tokens,
                                  finish_reason="quickfix" if quick is not None else "stop")
        if result is not None and result.text != base and _blocking_count(result.diagnostics_after, severities) < \
                _blocking_count(fallback.diagnostics_after, severities):
            fallback = result  # the model's unclean best (``return_unclean``) leaves less to do
        fallback.diagnostics_before = found
        fallback.seconds = time.perf_counter() - started
        if cancelled or (should_cancel is not None and should_cancel()):
            fallback.finish_reason = "cancelled"
        return fallback

    def fixes(
        self,
        code: str,
        *,
        diagnostics: list[Any] | None = None,
        path: str | None = None,
        language: str | None = None,
        include_model: bool = False,
        should_cancel: Callable[[], bool] | None = None,
        time_budget_s: float | None = None,
    ) -> list[Fix]:
        """The ways to fix ``code``, best first (the first one ``preferred``), for a code-action list:
        each with a title that says what it does, the whole fixed text, its kind and source and the
        diagnostics it leaves. Given ``diagnostics`` with lines, the fixes answer those lines.
        ``include_model`` adds "Fix with GLM-5" (the model's rewrite, :meth:`fix`) when no model-free
        fix leaves the code clean and the model's does."""
        started = time.perf_counter()
        language = language or guess_language(path)
        path = path or default_path(language)
        runner = self.repair.runner_for(language)
        severities = self.repair.settings.blocking_severities
        budget = time_budget_s if time_budget_s is not None else self.repair.settings.time_budget_s
        given = [diagnostic_dict(d) for d in diagnostics] if diagnostics is not None else None
        fixer = QuickFixer(runner, path, language, seconds=min(QUICK_FIX_SECONDS, budget), severities=severities,
                           should_cancel=should_cancel)
        found = fixer.fixes(code, lines=_asked_lines(given))
        if not include_model or (found and found[0].clean(severities)):
            return found
        left = budget - (time.perf_counter() - started)
        result = self.fix(code, diagnostics=diagnostics, path=path, language=language, should_cancel=should_cancel,
                          time_budget_s=left)
        if result.clean and result.finish_reason != "quickfix" and result.text != code:
            after = [Diagnostic(**d) for d in result.diagnostics_after]
            found.append(Fix(MODEL_FIX_TITLE, result.text, "model", "model", after,
                             seconds=time.perf_counter() - started))
            found = ranked_fixes(found, severities)
        return found

    def _model_fix(self, code: str, found: list[dict[str, Any]], *, path: str, language: str,
                   on_text: Callable[[str], None] | None, should_cancel: Callable[[], bool] | None,
                   time_budget_s: float | None = None) -> PipelineResult:
        """The whole of ``code`` with the block at fault rewritten by the model.

        The block is the innermost function or class holding the first of the diagnostics ``found``
        that names a line, or the first top-level one when none does (:func:`fix_region`). The
        model sees that block as the buggy version, its diagnostics as comments with the offending
        lines marked ``error_context``, then the block's header; it writes the body (or the header
        too, when that is where the error is). Everything else is kept as it was. A candidate that
        leaves a body of working code with none (:func:`keeps_enough`) is no fix. When no candidate
        passes the checks (and ``return_unclean`` is off) the input comes back unchanged.
        """
        runner = self.repair.runner_for(language)
        region = fix_region(code, first_diagnostic_line(found), language)
        shown = code[region.block_start:region.block_end]
        shift, height = code.count("\n", 0, region.block_start), shown.count("\n") + 1
        local = [d if line_of(d) is None else {**d, "line": d["line"] - shift} for d in found]
        local = [d for d in local if line_of(d) is None or 0 <= d["line"] < height]  # the block's own
        header = fix_header(shown, local, language)
        prefix = header + code[region.block_start:region.start]
        old_body = code[region.start:region.end]
        task = _Task(
            prompt=Prompt(prefix=prefix, spans=error_spans(shown, local, offset=header.index(shown.rstrip("\n")))),
            target=RepairTarget(code, region.start, region.end, path, language),
            multiline=True, stop=list(PYTHON_BODY_STOPS) if language == "python" else [],
            max_tokens=self.settings.multiline_max_tokens, block_prefix=prefix,
            wrap=lambda text: text if keeps_enough(old_body, text) else "", time_budget_s=time_budget_s,
        )
        result = self._run(task, on_text=on_text, should_cancel=should_cancel)
        if result.text or old_body.strip() == "":
            result.text = code[: task.target.start] + result.text + code[task.target.end:]
        else:
            result.text = code
        result.diagnostics_before = found
        result.diagnostics_after = [diagnostic_dict(d) for d in runner.diagnose(result.text, path, language).diagnostics]
        return result

    # ---- internals --------------------------------------------------------------------------

    def _build_prompt(self, text: str, offset: int, *, path: str | None, language: str,
                      budget_tokens: int | None = None) -> Prompt:
        if self.context is not None:
            try:
                return self.context.build_prompt(text, offset, path=path, language=language, budget_tokens=budget_tokens)
            except Exception:  # the context engine must never cost the user a completion
                log.exception("context engine failed; using the plain prompt")
        return plain_prompt(text, offset, self.settings.max_prefix_chars, self.settings.max_suffix_chars)

    def postprocess(self, text: str, task: _Task) -> str:
        """Shared by every front end (rules in ``glm5_lsp.postprocess``): no special tokens, stop
        strings, block or line end, then :func:`~glm5_lsp.postprocess.tidy` (suffix repeats,
        brackets, spacing) against the code around the target; the text past a healed
        ``forced_prefix`` against the code around the cursor, since the healed text is the user's."""
        text = cut_at_stops(strip_special_tokens(text), task.stop)
        if task.multiline:  # the line break after the block is the document's, not the completion's
            text = cut_at_block_end(text, task.block_prefix, task.target.language).rstrip()
        else:
            text = first_line(text)
        document, start = task.target.document, task.target.start
        unit = indent_unit(document) if task.multiline and self.settings.reindent else None
        heal = task.forced_prefix
        if heal and text.startswith(heal):  # tidied where the cursor is: the healed text is the user's own
            rest = tidy_for_document(text[len(heal):], document[:task.target.end], task.suffix,
                                     multiline=task.multiline, language=task.target.language, unit=unit)
            text = heal + rest if rest else ""
        else:
            text = tidy_for_document(text, document[:start], task.suffix, multiline=task.multiline,
                                     language=task.target.language, unit=unit)
        return task.wrap(text) if task.wrap is not None else text

    def _run(self, task: _Task, *, on_text: Callable[[str], None] | None,
             should_cancel: Callable[[], bool] | None) -> PipelineResult:
        started = time.perf_counter()
        settings = self.settings
        loop = self.repair
        if settings.unhurried and loop.monitor_factory is not None and loop.settings.monitor_on(task.target.language):
            _warm_names(task.target)
        request = CompletionRequest(
            prompt=task.prompt, max_tokens=task.max_tokens, temperature=settings.temperature, top_p=settings.top_p,
            seed=settings.seed, stop=list(task.stop), use_attention_policy=settings.use_attention_policy,
            should_cancel=should_cancel, forced_prefix=task.forced_prefix, min_token_prob=task.min_token_prob,
            step_stats=task.step_stats,
        )
        watch = (StatsWatch if task.step_stats else BlockWatch)(task.multiline, task.block_prefix,
                                                                task.target.language, on_text)
        repaired = loop.run(request, task.target, LoopTask(
            postprocess=functools.partial(self.postprocess, task=task), watch=watch,
            max_truncations=task.truncations, time_budget_s=task.time_budget_s,
        ))
        task.internals = getattr(watch, "stats", None)
        cancelled = should_cancel is not None and should_cancel()
        return PipelineResult(
            text=repaired.text or "", clean=repaired.clean,
            diagnostics_before=[diagnostic_dict(d) for d in repaired.diagnostics_before],
            diagnostics_after=[diagnostic_dict(d) for d in repaired.diagnostics_after], rounds=repaired.rounds,
            prompt_tokens=repaired.prompt_tokens, completion_tokens=repaired.tokens,
            seconds=time.perf_counter() - started, finish_reason="cancelled" if cancelled else repaired.finish_reason,
            finished_word=repaired.finished_word, vouched=repaired.vouched, remembered=repaired.remembered,
            recalled=repaired.recalled,
        )

def _skipping(count: int, on_text: Callable[[str], None]) -> Callable[[str], None]:
    """``on_text`` without the first ``count`` streamed characters (the healed word, already typed)."""
    seen = [0]

    def forward(piece: str) -> None:
        skip = max(0, min(len(piece), count - seen[0]))
        seen[0] += len(piece)
        if piece[skip:]:
            on_text(piece[skip:])

    return forward


def _end_line(text: str) -> str:
    return text + "\n" if text and not text.endswith("\n") else text


def _warm_names(target: RepairTarget) -> None:
    """What the decoding monitor's jedi lookups will need for ``target``'s document, loaded now."""
    try:
        warm_jedi(target.document, target.path)
    except Exception:  # jedi failing here must not fail the request: the monitor then checks less
        log.warning("jedi could not read the document ahead of the request", exc_info=True)


def default_path(language: str) -> str:
    """A file name the checkers accept for an unsaved buffer in ``language``."""
    return "untitled" + _UNTITLED.get(language, ".txt")


# --------------------------------------------------------------------------------------------
# Prompts used without the context engine
# --------------------------------------------------------------------------------------------


def plain_prompt(text: str, offset: int, max_prefix_chars: int, max_suffix_chars: int) -> Prompt:
    """The code around the cursor, cut at line boundaries, with the cursor's block marked."""
    start = max(0, offset - max_prefix_chars)
    if start > 0:
        newline = text.find("\n", start, offset)
        start = newline + 1 if newline != -1 else start
    end = min(len(text), offset + max_suffix_chars)
    if end < len(text):
        newline = text.rfind("\n", offset, end)
        end = newline + 1 if newline != -1 else end
    prefix, suffix = text[start:offset], text[offset:end]
    block_start = _top_level_start(prefix)
    spans = [Span(block_start, len(prefix), "current_block")] if block_start < len(prefix) else []
    return Prompt(prefix=prefix, suffix=suffix, spans=spans)


def _top_level_start(prefix: str) -> int:
    """Offset of the last line starting at column 0 (the statement the cursor is inside)."""
    at = len(prefix)
    while at > 0:
        line_start = prefix.rfind("\n", 0, at - 1) + 1
        line = prefix[line_start:at]
        if line.strip() and not line[0].isspace():
            return line_start
        if line_start == 0:
            return 0
        at = line_start
    return 0


def looks_like_code(prompt: str, language: str) -> bool:
    """A signature plus docstring (continue it) rather than a prose instruction (write from it)."""
    if language != "python":
        return bool(re.search(r"[{};]|\bfunction\b|\bfn\b|\bfunc\b", prompt))
    return bool(re.search(r"^\s*(def|class|async def|import|from)\b", prompt, re.MULTILINE))


def instruction_header(instruction: str, language: str) -> str:
    """A prose instruction as a comment block that a code model continues with code."""
    marker = "#" if language == "python" else "//"
    lines = [f"{marker} {line}".rstrip() for line in instruction.strip().splitlines()]
    return "\n".join(lines) + "\n"


QUICK_FIX_SECONDS = 2.0  # the model-free fixes' share of a fix's time, at most
MIN_MODEL_FIX_S = 1.0  # below this much time left, a fix does not start the model
MODEL_FIX_TITLE = "Fix with GLM-5"
QUICK_NAMES_SOURCE = "names"  # the model-free fixer's own attribute check (not a checker's finding)


def _asked_lines(diagnostics: list[dict[str, Any]] | None) -> list[int] | None:
    """The lines the caller's diagnostics name (where the user asked for a fix), or None."""
    if not diagnostics:
        return None
    lines = [line for line in map(line_of, diagnostics) if line is not None and line >= 0]
    return lines or None


def _blocking_count(diagnostics: list[dict[str, Any]], severities: tuple[str, ...]) -> int:
    return sum(1 for d in diagnostics if d.get("severity") in severities)


def idle_result(task: dict[str, Any], result: PipelineResult) -> str | None:
    """Why a result the checkers passed does no work (None when it does, or was not clean anyway).

    The checks pass text that is only comments, ``pass``, ``...`` or a bare ``return``: for a
    completion or a generated body that is no answer, and a fix that turns working code into such
    text removed it rather than fixing it (:func:`working_lines`, :func:`keeps_enough`).
    """
    if not result.clean:
        return None
    if task.get("kind") == "fix":
        code = task.get("code") if isinstance(task.get("code"), str) else ""
        if working_lines(result.text) == 0 or not keeps_enough(code, result.text):
            return "the fixed code does nothing: only comments, pass, ... or a bare return are left"
        return None
    if working_lines(result.text) == 0:
        return "the text does nothing: it is empty or only comments, pass, ... or a bare return"
    return None


def tidy_for_document(text: str, prefix: str, suffix: str, *, multiline: bool, language: str | None = None,
                      unit: str | None = None) -> str:
    """The shared rules (:func:`~glm5_lsp.postprocess.tidy`: suffix repeats, brackets, spacing), then
    multi-line text re-expressed in the document's indentation ``unit`` (None: as the model wrote it).
    Idempotent: a text it returns passes through it unchanged."""
    text = tidy(text, prefix, suffix, multiline=multiline, language=language)
    return reindent(text, unit) if multiline and unit else text
