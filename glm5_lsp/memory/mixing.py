"""Decoding with the memory: its next-token estimate mixed into the model's, and drafts from it.

At each step the longest suffix of the context found in the memory gives what followed it, by count
(:class:`~glm5_lsp.memory.matcher.Match`). As infini-gram does, the two distributions are
interpolated, ``p = lam * p_memory + (1 - lam) * p_model``, with ``lam`` read from a table over the
match's length, its number of occurrences and how much of them agree on one next token
(:class:`Interpolation`, fitted on held-out packages by ``glm5_lsp.memory.fit``, never on the
packages the benchmarks report). The processor returns ``log p``.

Order with the other processors (each sees what the one before returned): **mixing first**, on the
model's own logits; then the decoding monitor (``then``), which masks invalid names with ``-inf``
and so still removes a name the memory proposed where it does not exist; then token healing's forced
prefix (``backends.local.ForcedPrefix``, which wraps whatever processor the request carries).

:meth:`MemoryProcessor.propose` offers a draft: the memory's greedy continuation while the match is
long and agrees on its next token. The generator verifies it in one forward pass
(``model.generate``), so the text is the mixture's, sooner.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from glm5_lsp.memory.align import Estimate, TextMatcher
from glm5_lsp.memory.matcher import Matcher

LENGTH_EDGES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # a bucket starts at each
COUNT_EDGES = (1, 2, 4, 8, 32)
SHARE_EDGES = (0.0, 0.5, 0.9, 1.0)  # the top next id's share: < 0.5, < 0.9, < 1, all of them
TABLE_FILE = Path(__file__).with_name("interpolation.json")


def _bucket(value: float, edges: Sequence[float]) -> int:
    i = 0
    while i + 1 < len(edges) and value >= edges[i + 1]:
        i += 1
    return i


@dataclass
class Interpolation:
    """The memory's weight per (match length, occurrences, top share) bucket."""

    table: list[list[list[float]]]  # [length][count][share]
    source: str = ""  # what it was fitted on

    @classmethod
    def default(cls) -> Interpolation:
        """The shipped table (``interpolation.json``), else a conservative hand-set one."""
        try:
            data = json.loads(TABLE_FILE.read_text(encoding="utf-8"))
            table = data["table"]
            if (len(table) == len(LENGTH_EDGES) and all(len(row) == len(COUNT_EDGES) for row in table)
                    and all(len(cell) == len(SHARE_EDGES) for row in table for cell in row)):
                return cls(table, data.get("source", ""))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return cls.prior()

    @classmethod
    def prior(cls) -> Interpolation:
        """Before fitting: the weight grows with the match's length and its agreement."""
        table = []
        for length in LENGTH_EDGES:
            rows = []
            for count in COUNT_EDGES:
                cells = []
                for share in SHARE_EDGES:
                    base = 1 - math.exp(-length / 8)
                    cells.append(round(min(0.95, base * (0.3 + 0.7 * share) * (1 - 0.5 / (count + 1))), 4))
                rows.append(cells)
            table.append(rows)
        return cls(table, "prior")

    def weight(self, estimate: Estimate) -> float:
        if estimate.empty or estimate.match.length <= 0:
            return 0.0
        length, count, share = buckets(estimate)
        return self.table[length][count][share]

    def save(self, path: Path = TABLE_FILE, **extra: Any) -> None:
        path.write_text(json.dumps({"source": self.source, "length_edges": LENGTH_EDGES, "count_edges": COUNT_EDGES,
                                    "share_edges": SHARE_EDGES, "table": self.table, **extra}, indent=1) + "\n",
                        encoding="utf-8")


def _share_bucket(share: float) -> int:
    if share >= 1.0:
        return 3
    return 2 if share >= 0.9 else (1 if share >= 0.5 else 0)


def buckets(estimate: Estimate) -> tuple[int, int, int]:
    """The table cell of an estimate: its match's length, its number of occurrences, its top share."""
    _, share = estimate.top()
    match = estimate.match
    return _bucket(match.length, LENGTH_EDGES), _bucket(max(match.total, 1), COUNT_EDGES), _share_bucket(share)


@dataclass
class DraftSettings:
    """When the memory's continuation is offered as a draft."""

    enabled: bool = True
    max_tokens: int = 8
    min_length: int = 8  # the match must be at least this many ids long
    min_share: float = 0.75  # and its top next id this much of what followed


def mix(logits: Any, estimate: Estimate, lam: float) -> Any:
    """``log(lam * p_memory + (1 - lam) * softmax(logits))`` as a tensor like ``logits``."""
    import torch

    if lam <= 0 or estimate.empty:
        return logits
    ids, probs = estimate.ids, estimate.probs
    ids_t = torch.as_tensor(ids, dtype=torch.long)
    keep = ids_t < logits.shape[-1]
    p = torch.softmax(logits.float(), dim=-1).mul_(1 - lam)
    p[ids_t[keep]] += torch.as_tensor(probs, dtype=torch.float32)[keep] * lam
    return torch.log(p)


class MemoryProcessor:
    """A logits processor over one request's memory matcher.

    ``bind_prompt`` (the local backend calls it with the prompt's ids before decoding) sets the
    context to the prompt's code: the infilling prompt's prefix part, or the whole prompt, unless
    the processor was made around a ``text`` matcher bound already (the pipeline's: the document's
    code before the cursor, shared with the memory's up-front continuation). Each step
    reads the text generated so far (:class:`~glm5_lsp.memory.align.TextMatcher`: the memory's
    estimate wherever the text ends). ``then`` runs after the mixing (the decoding monitor)."""

    def __init__(self, matcher: Matcher | None, tokenizer: Any, interpolation: Interpolation | None = None,
                 then: Any = None, drafts: DraftSettings | None = None, text: TextMatcher | None = None) -> None:
        if (matcher is None) == (text is None):
            raise ValueError("a MemoryProcessor needs a matcher or a bound TextMatcher, not both")
        # ``text``: already bound to the code before the cursor (the request's own, shared with the
        # memory's up-front continuation: the estimates and match states it walked are not walked again)
        self.text = text if text is not None else TextMatcher(matcher, tokenizer)  # type: ignore[arg-type]
        self.tokenizer = tokenizer
        self.interpolation = interpolation or Interpolation.default()
        self.then = then
        self.drafts = drafts or DraftSettings()
        self.draft_stop = ""  # a draft ends after a token holding this (the request's line end)
        self.bound = self.prebound = text is not None
        self.steps = 0
        self.mixed_steps = 0  # steps where the memory had any weight

    def bind_prompt(self, prompt_ids: Sequence[int], stop: Sequence[str] = ()) -> None:
        tokenizer = self.tokenizer
        ids = list(prompt_ids)
        prefix_id, suffix_id = getattr(tokenizer, "fim_prefix_id", None), getattr(tokenizer, "fim_suffix_id", None)
        if ids and prefix_id is not None and ids[0] == prefix_id and suffix_id in ids:
            ids = ids[1:ids.index(suffix_id)]  # the code before the cursor
        if not self.prebound:  # bound to the document's own code already: the prompt adds nothing to match
            self.bind_text(tokenizer.decode(ids))
        self.draft_stop = "\n" if "\n" in stop else ""

    def bind_text(self, code: str) -> None:
        self.text.bind(code)
        self.bound = True

    def estimate(self, generated_ids: Sequence[int]) -> Estimate | None:
        if not self.bound:
            self.bind_text("")
        written = self.tokenizer.decode(list(generated_ids))
        if written.endswith("\ufffd"):
            return None  # inside a character's bytes: no text to match yet
        return self.text.estimate(written, within_piece=True)

    def __call__(self, generated_ids: Sequence[int], logits: Any) -> Any:
        self.steps += 1
        estimate = self.estimate(generated_ids)
        lam = self.interpolation.weight(estimate) if estimate is not None else 0.0
        if lam > 0:
            self.mixed_steps += 1
            logits = mix(logits, estimate, lam)
        if self.then is not None:
            logits = self.then(generated_ids, logits)
        return logits

    def propose(self, generated_ids: Sequence[int]) -> list[int]:
        """A draft to verify after ``generated_ids``: the memory's continuation while it is long
        and confident (empty when it is not)."""
        settings = self.drafts
        if not settings.enabled or settings.max_tokens <= 0:
            return []
        written = self.tokenizer.decode(list(generated_ids))
        if written.endswith("\ufffd"):
            return []
        return self.text.continuation(written, settings.max_tokens, settings.min_length, settings.min_share,
                                      self.draft_stop)

    # Pass-throughs the repair loop sets on the decoding monitor (``expect_word``, ``time_left``).
    def __getattr__(self, name: str) -> Any:
        then = self.__dict__.get("then")
        if then is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(then, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "time_left" and self.__dict__.get("then") is not None:
            setattr(self.__dict__["then"], name, value)
            return
        super().__setattr__(name, value)


@dataclass
class ProcessorFactory:
    """Per request, a :class:`MemoryProcessor` over a workspace memory (the wiring's entry point):
    ``factory(key, document, prefix_end, then=monitor)``; ``prefix_end`` is where the prompt's code
    ends in ``document`` (the cursor, less a healed word)."""

    memory: Any  # WorkspaceMemory
    tokenizer: Any
    interpolation: Interpolation = field(default_factory=Interpolation.default)
    drafts: DraftSettings = field(default_factory=DraftSettings)

    def __call__(self, key: str | None, document: str | None, prefix_end: int | None,
                 then: Callable | None = None, text: TextMatcher | None = None) -> MemoryProcessor:
        """``text``: a TextMatcher bound to ``document[:prefix_end]`` (:func:`bound_text`) to decode with."""
        if text is not None:
            return MemoryProcessor(None, self.tokenizer, self.interpolation, then, self.drafts, text=text)
        return MemoryProcessor(self.memory.matcher(key, document, prefix_end), self.tokenizer, self.interpolation,
                               then, self.drafts)


def bound_text(memory: Any, tokenizer: Any, key: str | None, document: str, offset: int,
               typed: str = "") -> TextMatcher:
    """A TextMatcher over ``memory`` for a request at ``offset`` of document ``key``, bound to the
    code before it (the cursor's own line excluded from what the matches found); ``typed``: the
    healed word after ``offset`` (``TextMatcher.bind``)."""
    matcher = memory.matcher(key, document, offset) if key is not None else memory.matcher()
    text = TextMatcher(matcher, tokenizer)
    # the document's ids before the cursor's chunk are the memory's already (``matcher`` brought it up to date)
    at_hand = getattr(memory, "ids_before", None) if key is not None else None
    known = (lambda end, need: at_hand(key, document, end, need)) if at_hand is not None else None
    text.bind(document[:offset], known, typed)
    return text


def continue_text(text: TextMatcher, tokenizer: Any, written: str = "", max_tokens: int = 48, stop: str = "\n",
                  min_length: int = 1) -> str:
    """The memory's greedy longest-match text after the bound code plus ``written``, cut at ``stop``."""
    ids = text.continuation(written, max_tokens, min_length=min_length, stop=stop)
    out = tokenizer.decode(ids)
    if stop and stop in out:
        out = out[:out.index(stop)]
    return out


def continuation_text(memory: Any, tokenizer: Any, key: str | None, document: str, offset: int,
                      max_tokens: int = 48, stop: str = "\n", min_length: int = 1) -> str:
    """The memory's own continuation at ``offset`` (no model): its greedy longest-match text, cut
    at ``stop``. With a served model (no logits to mix) this is one more candidate for the repair
    loop to judge like any other. A word the cursor ends needs no healing: the text is matched
    wherever it ends (:class:`~glm5_lsp.memory.align.TextMatcher`)."""
    return continue_text(bound_text(memory, tokenizer, key, document, offset), tokenizer, "", max_tokens, stop,
                         min_length)


def as_array(values: Sequence[float]) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)
