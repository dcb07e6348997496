"""Decoding with the memory: its next-token estimate mixed into the model's, and drafts from it.

At each step the longest suffix of the context found in the memory gives what followed it, by count
(:class:`~glm5_lsp.memory.matcher.Match`). As infini-gram does, the two distributions are
interpolated, ``p = lam * p_memory + (1 - lam) * p_model``, with ``lam`` read from a table over the
match's length, its number of occurrences and how much of them agree on one next token
(:class:`Interpolation`, fitted on held-out packages by ``glm5_lsp.memory.fit``, never on the
packages the benchmarks report). With ``memory.shorterSuffixes`` (off by default: lower held-out
perplexity, the same one-line answers, slower) shorter suffixes' estimates are mixed in too (an
n-gram model's lower orders: the longest match misses the next token about four times in ten on
held-out code), each component's weight a softmax over its match's length, occurrences and top
share, the model's over its own top probability (:class:`LevelGate`, fitted with the table). The
processor returns ``log p``.

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
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from glm5_lsp.memory.align import SHORTER_SLOTS, Estimate, TextMatcher
from glm5_lsp.memory.matcher import Matcher

log = logging.getLogger(__name__)

LENGTH_EDGES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # a bucket starts at each
COUNT_EDGES = (1, 2, 4, 8, 32)
SHARE_EDGES = (0.0, 0.5, 0.9, 1.0)  # the top next id's share: < 0.5, < 0.9, < 1, all of them
TABLE_FILE = Path(__file__).with_name("interpolation.json")


def _bucket(value: float, edges: Sequence[float]) -> int:
    i = 0
    while i + 1 < len(edges) and value >= edges[i + 1]:
        i += 1
    return i


COMPONENTS = 1 + SHORTER_SLOTS  # the memory's estimates a LevelGate weighs: the longest match's, then the shorter slots'


def component_features(estimates: Sequence[Estimate | None]) -> np.ndarray:
    """``(len(estimates), 3)``: each estimate's match length, occurrences and top share (zeros for none)."""
    out = np.zeros((len(estimates), 3))
    for k, estimate in enumerate(estimates):
        if estimate is not None and not estimate.empty and estimate.match.length > 0:
            out[k] = (estimate.match.length, estimate.match.total, estimate.top()[1])
    return out


@dataclass
class LevelGate:
    """Weights of the model and of the memory's estimates at each step: a softmax over one score per
    component. The model's score is ``model @ [1, its top probability]``; the memory's estimate in
    slot ``k`` (0 the longest match, then :data:`~glm5_lsp.memory.align.SHORTER_SLOTS` shorter
    suffixes) scores ``memory[k] @ [1, log(1 + length), log(1 + occurrences), top share]``; an empty
    slot gets no weight. Fitted by ``glm5_lsp.memory.fit`` (maximum likelihood on held-out tokens)."""

    memory: np.ndarray  # (COMPONENTS, 4)
    model: np.ndarray  # (2,)

    @classmethod
    def from_json(cls, data: Any) -> LevelGate:
        memory, model = np.asarray(data["memory"], dtype=np.float64), np.asarray(data["model"], dtype=np.float64)
        if memory.shape != (COMPONENTS, 4) or model.shape != (2,) or not (np.isfinite(memory).all()
                                                                         and np.isfinite(model).all()):
            raise ValueError(f"a level gate needs memory {(COMPONENTS, 4)} and model (2,), finite; "
                             f"got {memory.shape} and {model.shape}")
        return cls(memory, model)

    def to_json(self) -> dict[str, Any]:
        return {"memory": np.round(self.memory, 5).tolist(), "model": np.round(self.model, 5).tolist()}

    def weights(self, features: np.ndarray, model_top: np.ndarray) -> np.ndarray:
        """``(n, 1 + COMPONENTS)`` weights (the model's first) for ``n`` steps: ``features`` ``(n,
        COMPONENTS, 3)`` as :func:`component_features` gives them, ``model_top`` ``(n,)``."""
        length, total, share = features[..., 0], features[..., 1], features[..., 2]
        present = length > 0
        scores = (self.memory[:, 0] + self.memory[:, 1] * np.log1p(length) + self.memory[:, 2] * np.log1p(total)
                  + self.memory[:, 3] * share)
        scores = np.where(present, scores, -np.inf)
        model = (self.model[0] + self.model[1] * model_top)[:, None]
        scores = np.concatenate([model, scores], axis=1)
        scores -= scores.max(axis=1, keepdims=True)
        weights = np.exp(scores)
        return weights / weights.sum(axis=1, keepdims=True)


@dataclass
class Interpolation:
    """The memory's weight per (match length, occurrences, top share) bucket; where ``gate`` is set,
    the weights of the longest match's and the shorter suffixes' estimates come from it instead."""

    table: list[list[list[float]]]  # [length][count][share]
    source: str = ""  # what it was fitted on
    gate: LevelGate | None = None

    @classmethod
    def default(cls, levels: bool = False) -> Interpolation:
        """The shipped table (``interpolation.json``), with its level gate where ``levels``
        (``memory.shorterSuffixes``), else a conservative hand-set table. A file that cannot be
        read, or a table or gate of the wrong shape, is logged and the hand-set table used."""
        try:
            data = json.loads(TABLE_FILE.read_text(encoding="utf-8"))
            table = data["table"]
            if not (len(table) == len(LENGTH_EDGES) and all(len(row) == len(COUNT_EDGES) for row in table)
                    and all(len(cell) == len(SHARE_EDGES) for row in table for cell in row)):
                raise ValueError("the table's shape is not the edges'")
            gate = LevelGate.from_json(data["gate"]) if levels and data.get("gate") is not None else None
            return cls(table, data.get("source", ""), gate)
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning("the memory's interpolation file %s could not be used (%s): the hand-set table instead",
                        TABLE_FILE, error)
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
        gate = self.gate.to_json() if self.gate is not None else None
        path.write_text(json.dumps({"source": self.source, "length_edges": LENGTH_EDGES, "count_edges": COUNT_EDGES,
                                    "share_edges": SHARE_EDGES, "table": self.table, "gate": gate, **extra},
                                   indent=1) + "\n", encoding="utf-8")


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
    # A draft that is cut short costs its whole verification; a match of 12 ids proposes fewer of
    # them: on six files of the BENCHMARK_FIT packages (``memory.py drafts``' setup) drafts of up to
    # 16 ids after a 12-id match were faster than up to 8 after an 8-id match on five, by 0.07x of
    # the speed without drafts on average (BENCHMARKS.md, "Drafts: longer matches, longer drafts").
    max_tokens: int = 16
    min_length: int = 12  # the match must be at least this many ids long
    min_share: float = 0.75  # and its top next id this much of what followed


def mix(logits: Any, estimate: Estimate, lam: float) -> Any:
    """``log(lam * p_memory + (1 - lam) * softmax(logits))`` as a tensor like ``logits`` (one row).

    In numpy on the tensor's own buffer: a decoding step's 4,096 logits cost a few microseconds of
    arithmetic and ten of torch's dispatches (45 us a step in torch, 14 in numpy)."""
    import torch

    if lam <= 0 or estimate.empty:
        return logits
    if logits.device.type != "cpu":  # (an accelerator's logits: its own arithmetic)
        ids_t = torch.as_tensor(estimate.ids, dtype=torch.long, device=logits.device)
        keep = ids_t < logits.shape[-1]
        q = torch.softmax(logits.float(), dim=-1).mul_(1 - lam)
        q[ids_t[keep]] += torch.as_tensor(estimate.probs, dtype=torch.float32, device=logits.device)[keep] * lam
        return torch.log(q)
    x = logits.detach().float().numpy()
    p = np.exp(x - x.max())
    p *= (1 - lam) / p.sum()
    ids = estimate.ids
    keep = ids < p.shape[-1]
    p[ids[keep]] += (estimate.probs[keep] * lam).astype(p.dtype)
    return torch.from_numpy(np.log(p, out=p))


def mix_levels(logits: Any, estimates: Sequence[Estimate | None], gate: LevelGate) -> tuple[Any, bool]:
    """``log(w_model * softmax(logits) + sum_k w_k * p_k)`` with the gate's weights for the memory's
    ``estimates`` (the longest match's, then the shorter slots'); and whether the memory had any weight."""
    import torch

    p = torch.softmax(logits.float(), dim=-1)
    weights = gate.weights(component_features(estimates)[None], np.asarray([float(p.max())]))[0]
    if weights[0] >= 1.0:
        return logits, False
    p.mul_(float(weights[0]))
    size = logits.shape[-1]
    for weight, estimate in zip(weights[1:], estimates):
        if weight <= 0 or estimate is None:
            continue
        keep = estimate.ids < size
        p[torch.as_tensor(estimate.ids[keep], dtype=torch.long)] += torch.as_tensor(
            estimate.probs[keep] * weight, dtype=torch.float32)
    return torch.log(p), True


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

    def _written(self, generated_ids: Sequence[int]) -> str | None:
        if not self.bound:
            self.bind_text("")
        written = self.tokenizer.decode(list(generated_ids))
        return None if written.endswith("\ufffd") else written  # inside a character's bytes: no text yet

    def __call__(self, generated_ids: Sequence[int], logits: Any) -> Any:
        self.steps += 1
        written = self._written(generated_ids)
        if written is not None:
            estimate = self.text.estimate(written, within_piece=True)
            gate = self.interpolation.gate
            if gate is not None:
                logits, mixed = mix_levels(logits, [estimate, *self.text.shorter(written)], gate)
                self.mixed_steps += mixed
            else:
                lam = self.interpolation.weight(estimate)
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
