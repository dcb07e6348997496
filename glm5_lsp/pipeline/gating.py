"""The completion gate inside the pipeline: an as-you-type candidate the checks passed is shown only
when the gate (``glm5_lsp.gate.CompletionGate``, LightGBM beside the model) scores it at or above
``completion.minQuality``; below it, the strategy head says what to do instead.

``Pipeline.install_gate(gate)`` wires it once (the decoding observer in front of the monitor);
``Pipeline.complete(..., gated=True)`` then runs ``gate.begin()`` before the request and
:func:`judged` after its checks. Front ends never reach the gate themselves: what it decided comes
back on the :class:`~glm5_lsp.pipeline.core.PipelineResult` (``score``, ``features`` for the
acceptance log, and ``withheld``, why nothing is shown).

After a rejected candidate the strategy head chooses between finishing the typed word (the repair
loop's word finisher, its first word, checked like any candidate) and staying silent. It was also
trained with "regenerate", which on held-out code was worse than finishing the word on every figure
and costs another generation (BENCHMARKS.md, "The gate"): that choice stays silent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from glm5_lsp.backends.base import Backend, Completion, CompletionRequest
from glm5_lsp.checks.introduced import Splice, judge
from glm5_lsp.postprocess import trailing_identifier
from glm5_lsp.repair.stream import BlockWatch

log = logging.getLogger(__name__)


def judged(gate: Any, result: Any, document: str, offset: int, *, language: str, multiline: bool,
           trigger: str | None, finish: Callable[[], str], heal: str = "", unclean_shown: bool = False,
           internals: Any = None) -> Any:
    """``result`` (a ``PipelineResult`` whose ``text`` goes in at ``offset`` of ``document``) as the
    gate leaves it: unchanged when shown (``score`` and ``features`` filled in), else its text the
    finished word the strategy head asked for (``finish()``: the word's insertion text, the healed
    word ``heal`` included) or empty, with ``withheld`` saying why. A result the checks already
    emptied (or left unclean, unless ``unclean_shown``) is not judged."""
    if not (result.text or "").strip() or (not result.clean and not unclean_shown):
        return result
    verdict = gate.judge(result, document, offset, language=language, multiline=multiline, trigger=trigger,
                         internals=internals)
    result.score, result.features = verdict.score, verdict.features
    if verdict.show:
        result.text = verdict.text
        return result
    rejected, strategy = result.text, verdict.strategy or "silent"
    why = (f"the gate scored it {verdict.score:.3f}, under completion.minQuality {gate.threshold:.3f}; "
           f"then: {strategy}")
    result.text = ""
    if strategy == "finish_word" and not result.finished_word:
        word = finish()
        if heal:
            word = word[len(heal):] if word.startswith(heal) else ""
        if word.strip() and word != rejected:
            result.text, result.finished_word = word, True
            # what the acceptance log records is what is shown: the finished word's own features
            shown = gate.judge(result, document, offset, language=language, multiline=multiline, trigger=trigger,
                               internals=internals, count=False)
            result.score, result.features = shown.score, shown.features
            log.debug("%s: showing the typed word finished (%r)", why, word)
            return result
        why += " (no clean finished word)"
    elif strategy == "regenerate":
        why += " (not run: worse than finishing the word on held-out code; silent)"
    result.withheld = why
    log.debug("completion withheld: %s", why)
    return result


class StatsWatch(BlockWatch):
    """The repair loop's stream watch that also keeps the runtime's per-step internals of the last
    generation (``Completion.stats``: DSA's indexer, the MoE router, the hidden state), for a gate
    whose heads read them; the pipeline asks for them (``CompletionRequest.step_stats``) only then."""

    stats: Any = None

    def complete(self, backend: Backend, request: CompletionRequest) -> Completion:
        completion = super().complete(backend, request)
        self.stats = completion.stats
        return completion


def finished_word(loop: Any, target: Any, forced_prefix: str) -> str:
    """The word typed at the cursor finished from the names around it (``loop.finisher``, the likeliest
    word only), as insertion text at ``target`` (the healed ``forced_prefix`` included when there is
    one), or "" when there is none or it would add a blocking diagnostic."""
    if loop.finisher is None:
        return ""
    document = target.document
    typed = forced_prefix or trailing_identifier(document[: target.start])
    if not typed:
        return ""
    word_start = target.start if forced_prefix else target.start - len(typed)
    words = loop.finisher(document[:word_start], typed, document[target.end:], target.language)
    if not words:
        return ""
    text = words[0] if forced_prefix else words[0][len(typed):]
    if not text:
        return ""
    verdict = judge(Splice(document, target.start, target.end, text), loop.runner_for(target.language),
                    target.path, target.language)
    return "" if verdict.blocking(loop.settings.blocking_severities) else text
