"""One candidate as a fixed set of named numbers: what the request, the repair loop, the candidate and
its generation already say (no second model pass).

``features(result, info, stats)`` -> ``{name: float}`` over :data:`FEATURES` (every name present; NaN
where unknown: a served model without log-probabilities, internals the runtime does not hand out yet,
no workspace memory). Categorical values are small integer codes (:data:`CATEGORICAL`); LightGBM
reads them as categories.

- ``info`` is :class:`RequestInfo`: the request's own facts (:func:`request_info` reads them from the
  document and the cursor: language, single or multi-line, trigger kind, the typed word, the cursor's
  column, the lines since the block's header, the line's shape) and the memory's match where one exists;
- ``result`` is the pipeline's :class:`~glm5_lsp.pipeline.PipelineResult` (rounds, finish reason, the
  finished word, tokens, the text);
- ``stats`` is the candidate's generation (:class:`~glm5_lsp.gate.stats.DecodeStats`), or None.
"""

from __future__ import annotations

import builtins
import keyword
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from glm5_lsp.gate.stats import LAYER_STATS, STEP_STATS, DecodeStats
from glm5_lsp.postprocess import bracket_depth, trailing_identifier
from glm5_lsp.textdiff import common_prefix

NAN = float("nan")

LANGUAGES: tuple[str, ...] = ("python", "javascript", "typescript", "tsx", "go", "rust", "c", "cpp")
TRIGGERS: tuple[str, ...] = ("automatic", "invoked")
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "cancelled", "unsure", "memory")
# The statement the cursor's line starts with (Python's keywords, then the shapes every language has).
LINE_KINDS: tuple[str, ...] = (
    "other", "def", "class", "if", "elif", "else", "for", "while", "return", "import", "from", "with",
    "assert", "raise", "try", "except", "yield", "lambda", "assign", "call", "decorator",
)
# What stands before the typed word on its line.
BEFORE_WORD: tuple[str, ...] = ("start", "dot", "equals", "open", "comma", "colon", "space", "at", "other")
# What the word the candidate finishes is: a keyword that may end a line alone (``else``, ``pass``), another
# keyword, a builtin, a name the document already uses, or a new one.
WORD_KINDS: tuple[str, ...] = ("none", "line_keyword", "keyword", "builtin", "known", "new")
_LINE_KEYWORDS = frozenset({"else", "pass", "break", "continue", "try", "finally", "return", "None", "True", "False"})
# How the candidate's first line ends.
ENDINGS: tuple[str, ...] = ("empty", "word", "close", "open", "colon", "comma", "quote", "operator", "other")
DEPTH_BUCKETS = 8  # internals per layer, pooled into this many bins by relative depth
LINE_STATS = 3  # per-line log-probability features for the first this many lines of a candidate

_KEYWORD = re.compile(r"(?:async\s+)?([A-Za-z_]+)\b")
_ASSIGN = re.compile(r"^[\w.\[\], ]+(?:[-+*/%&|^]|//|\*\*|<<|>>)?=(?!=)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BUILTINS = frozenset(dir(builtins))
_WORD_REST = re.compile(r"[A-Za-z0-9_]*")  # what the first line adds to the typed word


def _internal_names() -> list[str]:
    names = []
    for stat in LAYER_STATS:
        names.append(f"{stat}_mean")
        names += [f"{stat}_d{k}" for k in range(DEPTH_BUCKETS)]
    for stat in STEP_STATS:
        names += [f"{stat}_mean", f"{stat}_last"]
    return names


FEATURES: tuple[str, ...] = (
    # the request
    "language", "multiline", "trigger", "typed_word_chars", "healed_chars", "cursor_column", "line_indent",
    "line_number", "lines_from_block_start", "line_kind", "after_dot", "open_brackets", "in_string",
    "line_prefix_words", "suffix_line_chars", "next_line_indent_delta", "before_word", "line_is_word",
    # the repair loop's outcome
    "rounds", "finished_word", "remembered", "truncated", "clean", "finish_reason", "prompt_tokens", "completion_tokens",
    # the candidate's shape
    "chars", "lines", "first_line_chars", "first_line_words", "ending", "closes_line", "net_brackets",
    "has_quote", "word_chars", "cut_chars", "word_kind", "only_word", "ends_line", "line_complete",
    # the candidate against the document: the completed line (anywhere, and as a whole line), the typed
    # line, the finished word
    "line_seen", "line_seen_whole", "typed_seen", "word_seen",
    # the generation, over the kept text and all of it
    "steps", "kept_steps", "healed_steps", "healed_lp_sum", "lp_mean", "lp_min", "lp_first", "lp_last", "lp_sum",
    "all_lp_mean", "all_lp_min",
    "ent_mean", "ent_max", "ent_last", "top_mean", "top_min", "margin_min", "end_prob_after", "end_prob_max_within",
    "end_prob_last", "completion_logprob",
    # per line (multi-line candidates)
    *(f"line{k}_{s}" for k in range(1, LINE_STATS + 1) for s in ("lp_mean", "lp_min", "chars")),
    # the workspace memory, where it exists (``pipeline.memory.Recollection``): its continuation and the
    # workspace's lines' most frequent rest, each against the candidate, and how those lines go on
    "memory_chars", "memory_agree_chars", "memory_equal", "line_chars", "line_agree_chars", "line_equal",
    "line_count", "line_total", "line_distinct", "line_share", "memory_views_agree",
    # the runtime's internals, once it hands them out
    *_internal_names(),
)
_INTERNAL = frozenset(_internal_names())


def internal_feature(name: str) -> bool:
    """Whether feature ``name`` reads the runtime's internals (``DecodeStats.per_layer``/``per_step``)."""
    return name in _INTERNAL


CATEGORICAL: tuple[str, ...] = ("language", "trigger", "line_kind", "finish_reason", "ending", "before_word",
                                "word_kind")


@dataclass
class RequestInfo:
    """The request's facts that the pipeline's result does not carry (``request_info`` reads them)."""

    language: str
    multiline: bool
    typed_word: str  # the identifier the cursor ends
    healed: str  # the part of it token healing had the model write again ("" when none)
    cursor_column: int
    line_indent: int
    line_number: int
    lines_from_block_start: int
    line_kind: str
    after_dot: bool
    open_brackets: int
    in_string: bool
    line_prefix_words: int
    suffix_line_chars: int  # text after the cursor on its line
    next_line_indent_delta: float  # the next non-blank line's indentation less this one's (NaN: none)
    before_word: str = "start"  # what stands before the typed word (BEFORE_WORD)
    line_is_word: bool = False  # the line so far is the typed word alone (after the indentation, or an ``@``)
    line_prefix: str = ""  # the cursor's line up to the cursor
    document: str = field(default="", repr=False)  # the document the request is in (not copied)
    trigger: str | None = None  # "automatic" (as you type) or "invoked"; None: unknown


def _line_kind(stripped: str) -> str:
    if stripped.startswith("@"):
        return "decorator"
    match = _KEYWORD.match(stripped)
    if match and match.group(1) in LINE_KINDS:
        return match.group(1)
    if _ASSIGN.match(stripped):
        return "assign"
    if "(" in stripped:
        return "call"
    return "other"


def _in_string(line_prefix: str) -> bool:
    """An odd number of unescaped quotes of one kind before the cursor on its line (a rough reading)."""
    text = line_prefix.replace("\\\\", "").replace("\\'", "").replace('\\"', "")
    return text.count('"') % 2 == 1 or text.count("'") % 2 == 1


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def request_info(document: str, offset: int, *, language: str, multiline: bool, trigger: str | None = None,
                 healing: bool = True, max_scan_lines: int = 200) -> RequestInfo:
    """The request's facts at character ``offset`` of ``document``: cheap text reads, a few hundred
    lines at most. ``healing``: whether the pipeline heals the typed word (its backend supports it)."""
    from glm5_lsp.healing import healed_text

    line_start = document.rfind("\n", 0, offset) + 1
    line_end = document.find("\n", offset)
    line_end = len(document) if line_end < 0 else line_end
    prefix_line = document[line_start:offset]
    after = document[offset:]
    stripped = prefix_line.lstrip(" \t")
    indent = _indent(prefix_line) if stripped else len(prefix_line)
    typed = trailing_identifier(prefix_line)
    healed = healed_text(document[:offset], after) if healing else ""
    before_word = prefix_line[: len(prefix_line) - len(typed)]
    line_number = document.count("\n", 0, line_start)
    # lines back to the header of the block the line is in (the nearest less-indented non-blank line)
    distance, at, scanned = NAN, line_start, 0
    while at > 0 and scanned < max_scan_lines:
        previous_start = document.rfind("\n", 0, at - 1) + 1
        line = document[previous_start:at - 1]
        scanned += 1
        if line.strip() and _indent(line) < indent:
            distance = float(scanned)
            break
        at = previous_start
    if math.isnan(distance) and indent == 0:
        distance = 0.0
    next_delta, at, scanned = NAN, line_end + 1, 0
    while at < len(document) and scanned < max_scan_lines:
        end = document.find("\n", at)
        end = len(document) if end < 0 else end
        line = document[at:end]
        scanned += 1
        if line.strip():
            next_delta = float(_indent(line) - indent)
            break
        at = end + 1
    return RequestInfo(
        language=language, multiline=multiline, typed_word=typed, healed=healed, cursor_column=len(prefix_line),
        line_indent=indent, line_number=line_number, lines_from_block_start=distance,
        line_kind=_line_kind(stripped), after_dot=before_word.endswith("."),
        open_brackets=max(0, bracket_depth(prefix_line, language)), in_string=_in_string(prefix_line),
        line_prefix_words=len(_WORD.findall(stripped)), suffix_line_chars=len(document[offset:line_end].strip()),
        next_line_indent_delta=next_delta, before_word=_before_word(before_word),
        line_is_word=bool(typed) and stripped.lstrip("@") == typed, line_prefix=prefix_line, document=document,
        trigger=trigger,
    )


def _before_word(text: str) -> str:
    """What stands before the typed word on its line (``text``: the line up to the word)."""
    if not text.strip():
        return "start"
    last = text[-1]
    if last == " ":
        stripped = text.rstrip()
        last = stripped[-1]
        if last == "=" and not stripped.endswith(("==", "!=", "<=", ">=")):
            return "equals"
        return "comma" if last == "," else "colon" if last == ":" else "open" if last in "([{" else "space"
    return {".": "dot", "=": "equals", "(": "open", "[": "open", "{": "open", ",": "comma", ":": "colon",
            "@": "at"}.get(last, "other")


def _word_kind(word: str, info: RequestInfo) -> str:
    if not word:
        return "none"
    if word in _LINE_KEYWORDS:
        return "line_keyword"
    if keyword.iskeyword(word):
        return "keyword"
    if word in _BUILTINS:
        return "builtin"
    return "known" if document_count(info, word) > 0 else "new"


def document_count(info: RequestInfo, text: str) -> int:
    """How often ``text`` occurs in the request's document."""
    return info.document.count(text)


_BLOCK_OPENERS = {"else": "if 1:\n pass\n", "elif": "if 1:\n pass\n", "except": "try:\n pass\n",
                  "finally": "try:\n pass\n"}


def _line_complete(line: str, language: str) -> float:
    """1.0 when the line would be a whole statement if it ended here (Python: it compiles inside a loop
    in a function, as the header of a block when it ends with a colon, after the statement it continues
    for ``else`` and the like, before a function for a decorator), 0.0 when not, NaN for other languages."""
    if language != "python":
        return NAN
    text = line.strip()
    if not text:
        return 0.0
    head = _KEYWORD.match(text)
    before = _BLOCK_OPENERS.get(head.group(1), "") if head else ""
    after = " pass" if text.endswith(":") else "\ndef f(): pass" if text.startswith("@") else ""
    body = (before + text + after).replace("\n", "\n  ")  # inside a loop in a function: return, break, await
    try:
        with warnings.catch_warnings():  # "'NoneType' object is not callable" and the like: it compiles
            warnings.simplefilter("ignore")
            compile("async def _g():\n for _ in ():\n  " + body, "<gate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return 0.0
    return 1.0


def _code(value: str | None, choices: Sequence[str]) -> float:
    if value is None:
        return NAN
    return float(choices.index(value)) if value in choices else float(len(choices))


def _ending(line: str) -> str:
    line = line.rstrip()
    if not line:
        return "empty"
    last = line[-1]
    if last.isalnum() or last == "_":
        return "word"
    if last in ")]}":
        return "close"
    if last in "([{":
        return "open"
    if last == ":":
        return "colon"
    if last == ",":
        return "comma"
    if last in "'\"`":
        return "quote"
    if last in "+-*/%=<>&|^~!.":
        return "operator"
    return "other"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else NAN


def _finite(values: Sequence[float]) -> list[float]:
    return [v if math.isfinite(v) else -30.0 for v in values]


def _step_features(stats: DecodeStats, kept_chars: int, text: str, healed: int) -> dict[str, float]:
    """Over the kept text's new steps (after the tokens that only rewrite the healed word: forced, so
    their own probabilities say how much the model agreed with the typed word, ``healed_lp_sum``), and
    over the whole generation."""
    out: dict[str, float] = {}
    n = stats.steps
    lps = _finite(stats.logprobs)
    kept = min(stats.steps_within(kept_chars), len(lps)) if kept_chars else 0
    lo = min(stats.steps_ending_within(healed), kept) if healed else 0
    new = lps[lo:kept]
    out["steps"] = float(n)
    out["kept_steps"] = float(kept - lo)
    out["healed_steps"] = float(lo)
    out["healed_lp_sum"] = sum(lps[:lo]) if healed else NAN
    out["lp_mean"] = _mean(new)
    out["lp_min"] = min(new) if new else NAN
    out["lp_first"] = new[0] if new else NAN
    out["lp_last"] = new[-1] if new else NAN
    out["lp_sum"] = sum(new) if new else NAN
    out["all_lp_mean"] = _mean(lps)
    out["all_lp_min"] = min(lps) if lps else NAN
    window = slice(lo, max(kept, lo + 1))
    ent = stats.entropies[window]
    out["ent_mean"] = _mean(ent)
    out["ent_max"] = max(ent) if ent else NAN
    out["ent_last"] = ent[-1] if ent else NAN
    top = stats.top_probs[window]
    out["top_mean"] = _mean(top)
    out["top_min"] = min(top) if top else NAN
    margins = stats.margins[window]
    out["margin_min"] = min(margins) if margins else NAN
    ends = stats.end_probs
    out["end_prob_after"] = ends[kept] if kept < len(ends) else NAN
    out["end_prob_max_within"] = max(ends[lo + 1:kept]) if kept > lo + 1 else NAN
    out["end_prob_last"] = ends[-1] if ends else NAN
    # generated beyond what is kept (a candidate cut short by the checks, a tidied tail, later lines)
    out["cut_chars"] = float(max(0, sum(stats.chars) - kept_chars)) if n else NAN
    # per line of the candidate (its own text; the healed word belongs to the first line)
    start = 0
    lines = text.split("\n")
    for k in range(1, LINE_STATS + 1):
        if k > len(lines):
            out[f"line{k}_lp_mean"] = out[f"line{k}_lp_min"] = out[f"line{k}_chars"] = NAN
            continue
        end = start + len(lines[k - 1]) + (healed if k == 1 else 0)
        lo, hi = stats.steps_within(start), stats.steps_within(end)
        chunk = lps[lo:hi]
        out[f"line{k}_lp_mean"] = _mean(chunk)
        out[f"line{k}_lp_min"] = min(chunk) if chunk else NAN
        out[f"line{k}_chars"] = float(len(lines[k - 1]))
        start = end + 1
    for stat in LAYER_STATS:  # the runtime's internals, where it handed them out (else left NaN)
        rows = stats.per_layer.get(stat)
        if rows:
            out.update(_layer_features(stat, rows))
    for stat in STEP_STATS:
        values = stats.per_step.get(stat)
        if values:
            out[f"{stat}_mean"] = _mean(values)
            out[f"{stat}_last"] = values[-1]
    return out


def _layer_features(stat: str, rows: Sequence[Sequence[float]]) -> dict[str, float]:
    """Steps x layers -> the mean, and the per-layer means pooled by relative depth."""
    out = {f"{stat}_mean": NAN, **{f"{stat}_d{k}": NAN for k in range(DEPTH_BUCKETS)}}
    rows = [r for r in rows if len(r)]
    if not rows:
        return out
    layers = len(rows[0])
    per_layer = [_mean([r[j] for r in rows if j < len(r)]) for j in range(layers)]
    out[f"{stat}_mean"] = _mean(per_layer)
    buckets: dict[int, list[float]] = {}
    for j, value in enumerate(per_layer):
        buckets.setdefault(j * DEPTH_BUCKETS // layers, []).append(value)
    for k, values in buckets.items():
        out[f"{stat}_d{k}"] = _mean(values)
    return out


def features(result: Any, info: RequestInfo, stats: DecodeStats | None = None) -> dict[str, float]:
    """Every name of :data:`FEATURES` for one candidate (``result.text``), NaN where unknown.

    ``result`` needs ``text``, ``rounds``, ``finish_reason``, ``finished_word``, ``clean``,
    ``prompt_tokens``, ``completion_tokens`` (a :class:`~glm5_lsp.pipeline.PipelineResult`), and may
    have ``truncated`` and ``logprob``."""
    text = result.text or ""
    lines = text.split("\n")
    first = lines[0]
    out: dict[str, float] = dict.fromkeys(FEATURES, NAN)
    out.update({
        "language": _code(info.language, LANGUAGES), "multiline": float(info.multiline),
        "trigger": _code(info.trigger, TRIGGERS), "typed_word_chars": float(len(info.typed_word)),
        "healed_chars": float(len(info.healed)), "cursor_column": float(info.cursor_column),
        "line_indent": float(info.line_indent), "line_number": float(info.line_number),
        "lines_from_block_start": float(info.lines_from_block_start), "line_kind": _code(info.line_kind, LINE_KINDS),
        "after_dot": float(info.after_dot), "open_brackets": float(info.open_brackets),
        "in_string": float(info.in_string), "line_prefix_words": float(info.line_prefix_words),
        "suffix_line_chars": float(info.suffix_line_chars), "next_line_indent_delta": info.next_line_indent_delta,
        "rounds": float(result.rounds), "finished_word": float(bool(result.finished_word)),
        "remembered": float(bool(getattr(result, "remembered", False))),
        "clean": float(bool(result.clean)), "finish_reason": _code(result.finish_reason, FINISH_REASONS),
        "prompt_tokens": float(result.prompt_tokens), "completion_tokens": float(result.completion_tokens),
        "chars": float(len(text)), "lines": float(len(lines)) if text else 0.0, "first_line_chars": float(len(first)),
        "first_line_words": float(len(_WORD.findall(first))), "ending": _code(_ending(first), ENDINGS),
        "net_brackets": float(bracket_depth(first, info.language)) if first else 0.0,
        "has_quote": float(any(q in first for q in "'\"`")),
        "word_chars": float(len(info.typed_word) + len(_WORD_REST.match(first).group(0))),
        "before_word": _code(info.before_word, BEFORE_WORD), "line_is_word": float(info.line_is_word),
    })
    out["closes_line"] = float(info.open_brackets + (bracket_depth(first, info.language) if first else 0) <= 0)
    # the completed line elsewhere in the document (code repeats itself): anywhere, and as a whole line
    typed_line = info.line_prefix.lstrip()
    out["typed_seen"] = float(min(document_count(info, typed_line) - 1, 50)) if len(typed_line) >= 3 else NAN
    line = (typed_line + first).strip()
    if first.strip() and len(line) >= 4:
        out["line_seen"] = float(min(document_count(info, line), 10))
        out["line_seen_whole"] = float(min(document_count(info, line + "\n"), 10))
    else:
        out["line_seen"] = out["line_seen_whole"] = 0.0
    rest_of_word = _WORD_REST.match(first).group(0)
    word = info.typed_word + rest_of_word if first.strip() else ""
    # the word's occurrences elsewhere: the document holds the typed part at the cursor, not the rest
    out["word_seen"] = float(min(document_count(info, word), 50)) if word and rest_of_word else 0.0
    out["word_kind"] = _code(_word_kind(word, info) if rest_of_word or not first.strip() else "none", WORD_KINDS)
    tail = first[len(rest_of_word):].strip()
    out["only_word"] = float(bool(first.strip()) and len(tail) <= 1 and not _WORD.search(tail))
    # the line is complete as it stands: the candidate closes what the line opened and ends at a stop
    out["ends_line"] = float(out["closes_line"] == 1.0 and _ending(first) in ("word", "close", "colon", "quote"))
    out["line_complete"] = _line_complete(typed_line + first, info.language) if first.strip() else NAN
    truncated = getattr(result, "truncated", None)
    out["truncated"] = NAN if truncated is None else float(bool(truncated))
    logprob = getattr(result, "logprob", None)
    out["completion_logprob"] = NAN if logprob is None else float(logprob)
    if stats is not None and stats.steps:
        kept = len(info.healed) + len(first)
        out.update(_step_features(stats, kept, text, len(info.healed)))
    recalled = getattr(result, "recalled", None)
    if recalled is not None:
        out.update(_memory_features(first, recalled, info.healed))
    return out


def _memory_features(first: str, recalled: Any, healed: str = "") -> dict[str, float]:
    """The candidate's first line against what the memory said at the cursor (``recalled``: a
    ``Recollection`` or its dict); a view that said nothing is NaN. The candidate is text after the
    cursor; the memory's views are insertion text at the healed word's start (``healed`` included),
    so they are read after it: a view that does not keep the typed word agrees on nothing."""
    get = recalled.get if isinstance(recalled, Mapping) else lambda name, default=None: getattr(recalled, name, default)
    candidate = first.rstrip()
    out: dict[str, float] = {}
    views = {}
    for name, key in (("memory", "continuation"), ("line", "line")):
        view = str(get(key, "") or "").split("\n", 1)[0].rstrip()
        kept = view.startswith(healed)
        view = view[len(healed):] if kept else view
        views[name] = view
        out[f"{name}_chars"] = float(len(view))
        out[f"{name}_agree_chars"] = float(common_prefix(candidate, view) if kept else 0) if view else NAN
        out[f"{name}_equal"] = float(kept and candidate == view) if view else NAN
    memory, line = views["memory"], views["line"]
    total = float(get("line_total", 0) or 0)
    out["line_count"] = float(get("line_count", 0) or 0)
    out["line_total"] = total
    out["line_distinct"] = float(get("line_distinct", 0) or 0)
    out["line_share"] = out["line_count"] / total if total else NAN
    out["memory_views_agree"] = float(bool(memory) and memory == line)
    return out


def vector(values: Mapping[str, float], names: Sequence[str]) -> list[float]:
    """``values`` in the order of ``names``, NaN for a name it lacks (a gate trained with more features
    than a backend gives, or fewer than this version computes)."""
    out = []
    for name in names:
        value = values.get(name, NAN)
        out.append(NAN if value is None else float(value))
    return out


def kept_text(text: str, option: str) -> str:
    """``text`` cut to a length option."""
    lines = text.rstrip("\n").split("\n")
    count = {"line": 1, "lines2": 2, "lines3": 3}.get(option, len(lines))
    return "\n".join(lines[:count])
