"""The completion gate inside the pipeline: an as-you-type candidate the checks passed is shown only
when the gate (``glm5_lsp.gate.CompletionGate``, LightGBM beside the model) scores it at or above
``completion.minQuality``; below it, the strategy head says what to do instead.

``Pipeline.install_gate(gate)`` wires it once (the decoding observer in front of the monitor);
``Pipeline.complete(..., gated=True)`` then runs ``gate.begin()`` before the request and
:func:`judged` after its checks. Front ends never reach the gate themselves: what it decided comes
back on the :class:`~glm5_lsp.pipeline.core.PipelineResult` (``score``, ``features`` for the
acceptance log, and ``withheld``, why nothing is shown).

After a rejected candidate, or where the model gave none that passed the checks, the workspace's
lines come first: when enough of the lines that start as the typed one go on the same way
(:func:`workspace_line`), that rest of the line is shown, checked like any candidate. Then the
memory's own continuation (:func:`memory_line`), where it says something else than the rejected
candidate: the gate judges it as a candidate that was not generated (``remembered``, no step
statistics: the model's are not its text's), and shows it at or above the same threshold. Then the
words both of the memory's views begin with (:func:`agreed_words`: the two say different lines, but
the same first word or words), cut where a word ends, shown as a finished word. Otherwise the
strategy head chooses between finishing the typed word (the repair loop's word finisher, its first
word, checked like any candidate) and staying silent; a finished word that is the word the memory's
continuation begins with is shown whichever it chose (:func:`memory_first_word`). The head was also
trained with "regenerate", which on held-out code was worse than finishing the word on every figure
and costs another generation (BENCHMARKS.md, "The gate"): that choice stays silent.
"""

from __future__ import annotations

import dataclasses
import keyword
import logging
import re
from collections.abc import Callable
from typing import Any

from glm5_lsp.backends.base import Backend, Completion, CompletionRequest
from glm5_lsp.postprocess import trailing_identifier
from glm5_lsp.repair.stream import BlockWatch

log = logging.getLogger(__name__)

# The workspace's lines stand in for a withheld candidate when at least this many of the lines that
# start as the typed one go on the same way, and at least this share of them. Chosen on the
# BENCHMARK_FIT packages' gate rows with out-of-fold gate scores (BENCHMARKS.md, "The workspace's
# lines where the gate withholds"): the lines so added were exact 8 times in 12 there, as precise as
# the gate's own target (``gate.train.TARGET_PRECISION``); two lines at half of them added 11 in 23.
LINE_MIN_COUNT = 2
LINE_MIN_SHARE = 0.7


def judged(gate: Any, result: Any, document: str, offset: int, *, language: str, multiline: bool,
           trigger: str | None, finish: Callable[[], str], heal: str = "", unclean_shown: bool = False,
           internals: Any = None, line: Callable[[Any], str] | None = None,
           remembered: Callable[[Any], str] | None = None, words: Callable[[Any], str] | None = None) -> Any:
    """``result`` (a ``PipelineResult`` whose ``text`` goes in at ``offset`` of ``document``) as the
    gate leaves it: unchanged when shown (``score`` and ``features`` filled in), else the
    workspace's rest of the line (``line(result)``: its checked insertion text, "" for none), or a
    copy holding the memory's continuation the gate shows (``remembered(result)``, the same), or the
    words the memory's two views begin with (``words(result)``: insertion text, "" for none), or the
    finished word the strategy head asked for (``finish()``: the word's insertion text, the healed
    word ``heal`` included), or empty, with ``withheld`` saying why. A result the checks
    already emptied (or left unclean, unless ``unclean_shown``) is not judged: only the workspace's
    line, the memory's continuation or the words its views agree on may stand in for it."""
    if not (result.text or "").strip() or (not result.clean and not unclean_shown):
        if line is not None and not multiline and _stood_in(gate, result, line, document, offset, from_lines=True,
                                                            language=language, trigger=trigger, internals=internals):
            log.debug("no clean candidate: showing the workspace's rest of the line (%r)", result.text)
            return result
        shown = (_from_memory(gate, result, remembered, document, offset, language=language, trigger=trigger,
                              heal=heal) if remembered is not None and not multiline else None)
        if shown is not None:
            log.debug("no clean candidate: showing the memory's continuation (%r)", shown.text)
            return shown
        if words is not None and not multiline and _stood_in(gate, result, words, document, offset, from_lines=False,
                                                             language=language, trigger=trigger, internals=internals,
                                                             goes_on=remembered):
            log.debug("no clean candidate: showing the words the memory's views agree on (%r)", result.text)
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
    if line is not None and not multiline and _stood_in(gate, result, line, document, offset, from_lines=True,
                                                        language=language, trigger=trigger, internals=internals,
                                                        rejected=rejected):
        log.debug("%s; the workspace's rest of the line shown instead (%r)", why, result.text)
        return result
    shown = (_from_memory(gate, result, remembered, document, offset, language=language, trigger=trigger,
                          rejected=rejected, heal=heal) if remembered is not None and not multiline else None)
    if shown is not None:
        log.debug("%s; the memory's continuation shown instead (%r, %.3f)", why, shown.text, shown.score)
        return shown
    if words is not None and not multiline and _stood_in(gate, result, words, document, offset, from_lines=False,
                                                         language=language, trigger=trigger, internals=internals,
                                                         rejected=rejected, goes_on=remembered):
        log.debug("%s; the words the memory's views agree on shown instead (%r)", why, result.text)
        return result
    # The memory's first word, where it finishes the typed word as the word finisher's likeliest
    # does, is shown whatever the strategy head chose (see ``memory_first_word``).
    remembered_word = memory_first_word(result.recalled) if not multiline else ""
    if result.finished_word and not multiline:
        # The candidate was the typed word finished already (nothing generated was clean): the
        # quality head judges whole lines, and a word alone is seldom all of one. It is shown where
        # the memory's continuation begins with that word, or where it is a keyword the check let
        # through (``from os im`` -> ``import``, its statement waiting for the rest of the line:
        # ``repair.loop.statement_to_come``); not on the strategy head's word alone, which on FIT
        # (104 in-word cursors) added 5 wrong words to 10 right ones here, where this rule adds 7
        # right ones and no wrong one (BENCHMARKS.md, "Keywords the line asks for").
        finished = _IDENTIFIER.match(heal + rejected)  # as the memory's continuation spells it (``heal``)
        agreed = bool(remembered_word) and finished is not None and finished.group(0) == remembered_word
        if rejected.strip() and (agreed or _begins_keyword(document, offset, rejected, heal)):
            result.text = rejected
            if agreed:
                _memory_goes_on(result, remembered)
            _judge_shown(gate, result, document, offset, language=language, multiline=multiline, trigger=trigger,
                         internals=internals)
            log.debug("%s: showing the typed word finished (%r)", why, result.text)
            return result
    if (strategy == "finish_word" or remembered_word) and not result.finished_word:
        word = finish()
        if heal:
            word = word[len(heal):] if word.startswith(heal) else ""
        finished = _IDENTIFIER.match(heal + word)
        agreed = bool(remembered_word) and finished is not None and finished.group(0) == remembered_word
        # The word the finisher and the memory agree on is shown even where the model wrote just that
        # word and the gate, judging it as a whole line, withheld it: the agreement is the evidence.
        if word.strip() and (agreed or (strategy == "finish_word" and word != rejected)):
            result.text, result.finished_word = word, True
            if agreed:
                _memory_goes_on(result, remembered)
            _judge_shown(gate, result, document, offset, language=language, multiline=multiline, trigger=trigger,
                         internals=internals)
            log.debug("%s: showing the typed word finished (%r%s)", why, word,
                      ", as the memory's continuation begins" if agreed else "")
            return result
        if strategy == "finish_word":
            why += " (no clean finished word)"
    elif strategy == "regenerate":
        why += " (not run: worse than finishing the word on held-out code; silent)"
    result.withheld = why
    log.debug("completion withheld: %s", why)
    return result


def _stood_in(gate: Any, result: Any, view: Callable[[Any], str], document: str, offset: int, *,
              language: str, trigger: str | None, internals: Any, rejected: str = "", from_lines: bool,
              goes_on: Callable[[Any], str] | None = None) -> bool:
    """Put what ``view`` gives (insertion text, "" for none) on ``result`` (True) when it is not the
    rejected text: the workspace's rest of the line (``from_lines``), else words shown as a finished
    word (those both of the memory's views begin with; the memory's line instead where it goes on
    from them, ``goes_on``: :func:`_memory_goes_on`); the acceptance log records its own features."""
    text = view(result)
    if not text.strip() or text == rejected:
        return False
    result.text, result.clean, result.from_lines, result.finished_word = text, True, from_lines, not from_lines
    result.diagnostics_after = []
    if goes_on is not None:
        _memory_goes_on(result, goes_on)
    _judge_shown(gate, result, document, offset, language=language, multiline=False, trigger=trigger,
                 internals=internals)
    return True


def stand_in(result: Any, text: str) -> Any:
    """``result`` (a ``PipelineResult``) with the memory's continuation ``text`` (checked, insertion
    text at the cursor) in place of its candidate: clean, not generated (``remembered``: no tokens of
    its own), what the memory said kept. The gate's data (``gate.collect``) judges the same copy."""
    return dataclasses.replace(result, text=text, clean=True, remembered=True, finished_word=False,
                               from_lines=False, vouched=False, diagnostics_after=[], completion_tokens=0,
                               finish_reason="memory", score=None, features={}, withheld="")


def _from_memory(gate: Any, result: Any, remembered: Callable[[Any], str], document: str, offset: int, *,
                 language: str, trigger: str | None, rejected: str = "", heal: str = "") -> Any:
    """``result`` with the memory's continuation (``remembered(result)``) in its place (:func:`stand_in`)
    where it may stand in for the rejected text (:func:`may_stand_in`; ``heal``: the healed word the
    workspace's lines begin with) and the gate, judging it as a candidate that was not generated, would
    show it; None otherwise."""
    text = remembered(result)
    if not may_stand_in(text, rejected, result.recalled, heal):
        return None
    candidate = stand_in(result, text)
    verdict = gate.judge(candidate, document, offset, language=language, multiline=False, trigger=trigger,
                         generated=False, count=False)
    if not verdict.show:
        return None
    candidate.score, candidate.features = verdict.score, verdict.features
    return candidate


def may_stand_in(text: str, rejected: str, recalled: Any, heal: str = "") -> bool:
    """Whether the memory's continuation ``text`` (insertion text) may stand in for the ``rejected``
    candidate: it says something, something else, and does not stop inside a word that the rejected
    text or the workspace's lines (``recalled.line``, which begins with the healed word ``heal``) spell
    on (:func:`cut_inside_word`). The gating and the gate's data collection ask the same."""
    if not text.strip() or text == rejected:
        return False
    line = recalled.line if recalled is not None else ""
    if cut_inside_word(text, rejected, line[len(heal):] if line.startswith(heal) else ""):
        log.debug("the memory's continuation %r stops inside a word: not shown", text)
        return False
    return True


def cut_inside_word(text: str, *spelled: str) -> bool:
    """Whether ``text`` stops inside a word that one of ``spelled`` (other answers at the same place)
    writes on: ``gu`` where the model wrote ``gument(`` (the memory's continuation ran into ids it does
    not hold after ``ar`` and stopped at ``argu``; the gate, reading it as a short, sure answer, showed
    it on BENCHMARK_FIT). A word cut short is never what the line holds."""
    if not text or not _WORD.match(text[-1]):
        return False
    n = len(text)
    return any(len(other) > n and other.startswith(text) and _WORD.match(other[n]) is not None for other in spelled)


def _memory_goes_on(result: Any, remembered: Callable[[Any], str] | None) -> None:
    """Where the word(s) on ``result`` are shown because two sources agree the line begins so (the
    word finisher and the memory's continuation; the memory's two views), the memory's checked first
    line (``remembered(result)``, insertion text) in their place when it goes on from them (the same
    words, then more): the agreement is what shows them, and the memory's line keeps them. On in-word
    cursors of the BENCHMARK_FIT packages the line was the rest of the line 8 times in 66 after a
    finished word and 2 times in 26 after the views' words, where the words alone never were (edit
    similarity 0.24 -> 0.49 and 0.46; BENCHMARKS.md, "The memory's line after its word"). The words
    are shown whatever the gate said of the line (it may be the very candidate it withheld): its
    threshold weighs showing something against showing nothing, and here something is shown either
    way, the line no less right than its first words."""
    word = result.text
    line = remembered(result) if remembered is not None and word else ""
    if len(line) > len(word) and line.startswith(word) and not _WORD.match(line[len(word)]):
        result.text, result.finished_word, result.remembered = line, False, True


def _judge_shown(gate: Any, result: Any, document: str, offset: int, *, language: str, multiline: bool,
                 trigger: str | None, internals: Any) -> None:
    """What the acceptance log records is what is shown: the score and features of the text put on
    ``result`` in place of the rejected one (not counted again for drift)."""
    shown = gate.judge(result, document, offset, language=language, multiline=multiline, trigger=trigger,
                       internals=internals, count=False)
    result.score, result.features = shown.score, shown.features


def workspace_line(loop: Any, target: Any, recalled: Any, forced_prefix: str) -> str:
    """The workspace's lines' rest of the line at ``target`` (``recalled``: the request's
    ``pipeline.memory.Recollection``) as insertion text less the healed ``forced_prefix``, where at
    least :data:`LINE_MIN_COUNT` lines and :data:`LINE_MIN_SHARE` of those that start as the typed
    one go on that way and it adds no blocking diagnostic; "" otherwise."""
    if recalled is None or not settled(recalled.line_count, recalled.line_total):
        return ""
    return _checked_line(loop, target, recalled.line, forced_prefix)


def memory_line(loop: Any, target: Any, recalled: Any, forced_prefix: str,
                tidy: Callable[[str], str] | None = None) -> str:
    """The memory's token-level continuation at ``target`` (``recalled``), its first line (through
    ``tidy``, the post-processing a candidate gets), as insertion text less the healed
    ``forced_prefix``, where it adds no blocking diagnostic; "" otherwise."""
    if recalled is None:
        return ""
    return _checked_line(loop, target, recalled.continuation, forced_prefix, tidy)


def _checked_line(loop: Any, target: Any, view: str, forced_prefix: str,
                  tidy: Callable[[str], str] | None = None) -> str:
    text = view.split("\n", 1)[0].rstrip()
    if tidy is not None:
        text = tidy(text).rstrip()
    if not text.startswith(forced_prefix) or not text[len(forced_prefix):].strip():
        return ""
    checked = _checked(loop, target, text)
    return checked[len(forced_prefix):] if checked else ""


# What a shared start is cut into: names, numbers (a decimal point and exponent included, so 0.25 and
# 0.5 share no number), runs of white space, single other characters.
_PIECE = re.compile(r"[^\W\d]\w*|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\s+|.", re.DOTALL)
_WORD = re.compile(r"\w")


def agreed_words(first: str, second: str, typed: str = "") -> str:
    """The longest start of ``first`` and ``second`` made of the same whole pieces (names, numbers,
    white space, other characters) in both, cut after its last name or number, beyond ``typed``
    (what both begin with that is typed already: a healed word); "" for none
    (``return self.x`` and ``return self.y``: ``return self``; ``count=0.25`` and ``count=0.5``: ``count``)."""
    if not first.startswith(typed) or not second.startswith(typed):
        return ""
    pieces = (_PIECE.findall(first), _PIECE.findall(second))
    end = kept = 0
    for one, other in zip(*pieces):
        if one != other:
            break
        end += len(one)
        if _WORD.match(one):
            kept = end
    return first[:kept] if kept > len(typed) else ""


_IDENTIFIER = re.compile(r"\w+")


def _begins_keyword(document: str, offset: int, text: str, typed: str = "") -> bool:
    """Whether the word typed before ``offset`` of ``document`` (``typed`` instead: a healed word),
    finished by ``text``, is a Python keyword."""
    typed = typed or trailing_identifier(document[max(0, offset - 200):offset])  # a keyword is short
    whole = _IDENTIFIER.match(typed + text)
    return whole is not None and keyword.iskeyword(whole.group(0))


def memory_first_word(recalled: Any) -> str:
    """The name or number the memory's token-level continuation begins with (``recalled``: insertion
    text at the target, a healed word included), "" for none. Where the word finisher's likeliest word
    is the same, the two were right 136 times in 144 at 310 in-word cursors of the BENCHMARK_FIT
    packages (the word finisher alone 193 of the 310, the memory alone 178; BENCHMARKS.md, "The word
    finisher and the memory agreeing")."""
    if recalled is None:
        return ""
    found = _IDENTIFIER.match(recalled.continuation)
    return found.group(0) if found is not None else ""


def memory_words(loop: Any, target: Any, recalled: Any, forced_prefix: str) -> str:
    """Where the memory's two views (``recalled``: its token-level continuation and the workspace's
    lines' rest of the line, each as insertion text with the healed ``forced_prefix``) say different
    first lines that begin with the same words (:func:`agreed_words`), those words as insertion text
    less ``forced_prefix``, where they add no blocking diagnostic (a cut: no colon added); "" otherwise.
    On the BENCHMARK_FIT packages' cursors where nothing else was shown, the two views' first word was
    the file's 11 times in 12 (BENCHMARKS.md, "The words the memory's views agree on")."""
    if recalled is None:
        return ""
    first, second = (view.split("\n", 1)[0].rstrip() for view in (recalled.continuation, recalled.line))
    if not first or not second or first == second:
        return ""
    words = agreed_words(first, second, forced_prefix)
    if not words[len(forced_prefix):].strip():
        return ""
    # Words that begin a keyword's statement may leave it waiting for the rest of the line (``el`` ->
    # ``else``, ``ex`` -> ``except OSError``), as the word finisher's keyword may.
    opens = target.language == "python" and _begins_keyword(target.document, target.start, words)
    found = loop.clean_form(words, target, forced=forced_prefix, check_word=False, close_header=False,
                            incomplete_ok=opens)
    return found[0][len(forced_prefix):] if found is not None else ""


def settled(count: int, total: int, min_count: int = LINE_MIN_COUNT, min_share: float = LINE_MIN_SHARE) -> bool:
    """Whether ``count`` of the ``total`` lines that start as the typed one going on one way is enough
    for that rest of the line to stand in for a withheld candidate."""
    return total > 0 and count >= min_count and count / total >= min_share


def _checked(loop: Any, target: Any, text: str) -> str:
    """``text`` in place of ``target``'s range where it adds no blocking diagnostic to its document, a
    block header's missing colon added where the lines below show its body (``RepairLoop.clean_form``);
    "" where it blocks."""
    found = loop.clean_form(text, target, check_word=False)
    return found[0] if found is not None else ""


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
    """The word typed at the cursor finished from the names around it, the likeliest word only
    (``RepairLoop.finish_word``), as insertion text at ``target`` (the healed ``forced_prefix``
    included when there is one), or "" when there is none or it would add a blocking diagnostic."""
    finished = loop.finish_word(forced_prefix, target, tries=1)
    return finished.text if finished is not None else ""
