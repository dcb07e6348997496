"""What one generation tells about itself, step by step: the container the gate's features are read from.

:class:`DecodeStats` holds per-step numbers of one generation. Today :class:`StepObserver` fills the
part a logits processor can see (the model's distribution at each step: the chosen token's
log-probability, the entropy, the top probability and its margin, the probability of ending the line
there, and each token's text length). The runtime's internals (DSA's indexer, the MoE router, the last
hidden state: ``per_layer`` and ``per_step``, under the names in :data:`LAYER_STATS` and
:data:`STEP_STATS`) come from the runtime's own per-step statistics (``Completion.stats``), which the
pipeline asks for only when the gate's heads read them; otherwise they are absent, and the gate reads
them as missing (NaN), as it does everything a served model does not return.

:class:`DecodeRecorder` wraps the repair loop's
``monitor_factory`` so every generation's processor chain starts with a :class:`StepObserver`
(observing, never changing the logits), and ``recorder.last()`` after a request gives the stats of the
last generation it ran (the one the returned candidate most often comes from).
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Per step and per layer, filled by the runtime once it hands them out (``DecodeStats.per_layer``):
LAYER_STATS: tuple[str, ...] = (
    "dsa_concentration",  # share of the indexer's top-k score mass on its top 16 keys, mean over queries
    "dsa_mass_error_context",  # attention mass (over the selected keys) on error-context keys
    "dsa_mass_current_block",  # ... on the cursor's block
    "dsa_mass_api_doc",  # ... on API-doc keys
    "moe_router_entropy",  # entropy of the router's distribution over routed experts (MoE layers)
    "moe_top_weight",  # the largest routing weight
    "moe_shared_share",  # the shared experts' share of the MoE output's norm
)
MAX_STEPS = 64  # steps whose distribution the observer summarises (a single-line completion has at most 32)
# Per step, one number (``DecodeStats.per_step``):
STEP_STATS: tuple[str, ...] = (
    "hidden_norm",  # the last hidden state's norm (before the final norm)
)


@dataclass
class DecodeStats:
    """One generation, step by step. Lists are per decoding step, in order; a list may be empty
    (nothing known). ``chars[i]`` is the length of step ``i``'s token text, so a step can be placed in
    the generated text (``text_end(i)``)."""

    logprobs: list[float] = field(default_factory=list)  # the chosen token's, under the model's distribution
    entropies: list[float] = field(default_factory=list)  # nats
    top_probs: list[float] = field(default_factory=list)  # the likeliest token's probability
    margins: list[float] = field(default_factory=list)  # top probability minus the second's
    end_probs: list[float] = field(default_factory=list)  # P(a line break or the end of text) at the step
    chars: list[int] = field(default_factory=list)  # the chosen token's text length (0 for a special token)
    # Runtime internals (see LAYER_STATS and STEP_STATS): name -> per step (-> per layer).
    per_layer: dict[str, list[list[float]]] = field(default_factory=dict)
    per_step: dict[str, list[float]] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.entropies)

    def _ends(self) -> list[int]:
        """Characters written once each step's token is (cumulative ``chars``), computed once per list."""
        cached = self.__dict__.get("_ends_cache")
        if cached is None or cached[0] is not self.chars or cached[1] != len(self.chars):
            ends = list(itertools.accumulate(self.chars))
            self.__dict__["_ends_cache"] = cached = (self.chars, len(self.chars), ends)
        return cached[2]

    def text_end(self, step: int) -> int:
        """Characters generated once step ``step``'s token is written."""
        ends = self._ends()
        return ends[min(step, len(ends) - 1)] if ends and step >= 0 else 0

    def steps_ending_within(self, length: int) -> int:
        """How many leading steps' tokens end inside the first ``length`` characters."""
        return bisect.bisect_right(self._ends(), length)

    def steps_within(self, length: int) -> int:
        """How many leading steps wrote their tokens inside the first ``length`` characters (a token that
        begins inside them counts)."""
        ends = self._ends()
        # step n begins at ends[n - 1] (0 for the first): those beginning before ``length``
        return 0 if length <= 0 or not ends else min(len(ends), bisect.bisect_left(ends, length) + 1)


class StepObserver:
    """A logits processor that records :class:`DecodeStats` and returns what ``inner`` returns.

    It sees the model's own logits (before the decoding monitor, ``inner``, changes them). While
    decoding it only keeps a copy of each step's logits (one small copy: the step's cost stays the
    model's); ``finish`` computes every statistic at once over all the steps. The token chosen at a
    step is known at the next call (``generated_ids[-1]``); the last step's (after which the generation
    ended) is taken to be the likeliest one after ``inner``'s changes, as greedy decoding chooses it.
    Attributes the repair loop and the local backend look for on the processor (``expect_word``,
    ``time_left``, a memory processor's ``bind_prompt`` and ``propose``) pass through to ``inner``.
    """

    def __init__(self, token_strings: Sequence[str], end_ids: Sequence[int], inner: Any = None,
                 end_mask: Any = None) -> None:
        self.inner = inner
        self.stats = DecodeStats()
        self._strings = token_strings
        self._end_ids = list(end_ids)
        self._end_mask = end_mask  # float [V]: 1 at the end ids (a recorder makes it once)
        self._logits: list[Any] = []  # the first MAX_STEPS steps' logits, as the model gave them
        self._steps = 0  # steps seen
        self._chosen: list[int] = []  # the token chosen at each step but the last
        self._last_out: Any = None  # the last step's logits after inner's changes
        self._finished = False

    def __call__(self, generated_ids: Sequence[int], logits: Any) -> Any:
        if self._steps and generated_ids:
            self._chosen.append(int(generated_ids[-1]))
        if self._steps < MAX_STEPS:  # a copy (inner may change ``logits`` in place); later steps: counted only
            self._logits.append(logits.detach().clone())
        self._steps += 1
        out = self.inner(generated_ids, logits) if self.inner is not None else logits
        self._last_out = out
        self._finished = False
        return out

    def finish(self) -> DecodeStats:
        """The stats of every step so far (the last one's token taken to be the likeliest); the
        distribution's figures for the first :data:`MAX_STEPS` steps (later ones have their token's
        length only). One pass over the steps: a log-softmax, its exponent, two reductions, a top-2."""
        if self._finished or not self._steps:
            return self.stats
        import torch

        chosen = list(self._chosen[: self._steps - 1])
        chosen.append(int(torch.argmax(self._last_out)))
        count = min(self._steps, MAX_STEPS)
        steps = torch.stack(self._logits[:count]).float()  # [S, V]
        vocab = steps.shape[1]
        logp = torch.log_softmax(steps, dim=1)
        probs = logp.exp()
        first = chosen[:count]
        valid = [0 <= c < vocab for c in first]
        index = torch.tensor([c if ok else 0 for c, ok in zip(first, valid)], dtype=torch.long)
        picked = logp.gather(1, index[:, None])[:, 0].tolist()
        top = torch.topk(probs, min(2, vocab), dim=1).values  # [S, 2]
        mask = self._end_mask
        if mask is None or mask.shape[0] != vocab:
            mask = end_mask(self._end_ids, vocab)
        stats = self.stats
        stats.logprobs = [v if ok else -math.inf for v, ok in zip(picked, valid)]
        stats.entropies = (-(probs * logp).sum(dim=1)).tolist()
        stats.top_probs = top[:, 0].tolist()
        stats.margins = (top[:, 0] - top[:, 1]).tolist() if top.shape[1] > 1 else list(stats.top_probs)
        stats.end_probs = (probs @ mask).tolist()
        strings = self._strings
        stats.chars = [len(strings[c]) if 0 <= c < len(strings) else 0 for c in chosen]
        self._finished = True
        return stats

    # ---- pass-throughs to the processor it wraps ------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("_"):
            raise AttributeError(name)
        return getattr(inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "time_left" and self.__dict__.get("inner") is not None:
            setattr(self.__dict__["inner"], name, value)
            return
        super().__setattr__(name, value)


def end_mask(end_ids: Sequence[int], vocab: int) -> Any:
    """A float vector over the vocabulary, 1 at ``end_ids``: a step's end probability is its
    probabilities times it."""
    import torch

    mask = torch.zeros(vocab, dtype=torch.float32)
    ids = [i for i in end_ids if 0 <= i < vocab]
    if ids:
        mask[torch.tensor(ids, dtype=torch.long)] = 1.0
    return mask


def end_token_ids(token_strings: Sequence[str]) -> list[int]:
    """Ids whose token ends a line or the text: a line break in its text, or a special token (no text)."""
    return [i for i, piece in enumerate(token_strings) if "\n" in piece or piece == ""]


class DecodeRecorder:
    """Puts a :class:`StepObserver` first in every generation a pipeline runs, and keeps the stats.

    ``install(pipeline)`` wraps ``pipeline.repair.monitor_factory`` (the repair loop calls it once per
    generation, for languages where the monitor is on: Python today); per thread, the observers of the
    requests since ``begin()`` are kept and ``last()`` closes and returns the newest one's stats.
    """

    def __init__(self, token_strings: Sequence[str]) -> None:
        self.token_strings = token_strings
        self.end_ids = end_token_ids(token_strings)
        self.end_mask = end_mask(self.end_ids, len(token_strings)) if token_strings else None
        self._local = threading.local()

    def wrap(self, factory: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
        def observed(target: Any) -> StepObserver:
            inner = factory(target) if factory is not None else None
            observer = StepObserver(self.token_strings, self.end_ids, inner, self.end_mask)
            self._observers().append(observer)
            return observer

        return observed

    def install(self, pipeline: Any) -> None:
        template = pipeline.repair
        template.monitor_factory = self.wrap(template.monitor_factory)

    def _observers(self) -> list[StepObserver]:
        found = getattr(self._local, "observers", None)
        if found is None:
            found = self._local.observers = []
        return found

    def begin(self) -> None:
        """Forget this thread's earlier generations (call before a request)."""
        self._observers().clear()

    def generations(self) -> list[DecodeStats]:
        """Every generation since ``begin()`` on this thread, closed, oldest first."""
        return [observer.finish() for observer in self._observers()]

    def last(self) -> DecodeStats | None:
        """The newest generation's stats since ``begin()`` on this thread, or None."""
        observers = self._observers()
        return observers[-1].finish() if observers else None
