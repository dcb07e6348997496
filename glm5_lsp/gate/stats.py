"""What one generation tells about itself, step by step: the container the gate's features are read from.

:class:`DecodeStats` holds per-step numbers of one generation. Today :class:`StepObserver` fills the
part a logits processor can see (the model's distribution at each step: the chosen token's
log-probability, the entropy, the top probability and its margin, the probability of ending the line
there, and each token's text length). The runtime's internals (DSA's indexer, the MoE router, the last
hidden state) are named here so the generator can fill them once it hands out per-step statistics
(``per_layer`` and ``per_step``, under the names in :data:`LAYER_STATS` and :data:`STEP_STATS`); until
then they are absent, and the gate reads them as missing (NaN), as it does everything a served model
does not return.

Wiring today (no change to the model or the pipeline): :class:`DecodeRecorder` wraps the repair loop's
``monitor_factory`` so every generation's processor chain starts with a :class:`StepObserver`
(observing, never changing the logits), and ``recorder.last()`` after a request gives the stats of the
last generation it ran (the one the returned candidate most often comes from).
"""

from __future__ import annotations

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

    def text_end(self, step: int) -> int:
        """Characters generated once step ``step``'s token is written."""
        return sum(self.chars[: step + 1])

    def steps_ending_within(self, length: int) -> int:
        """How many leading steps' tokens end inside the first ``length`` characters."""
        written = 0
        for n, size in enumerate(self.chars):
            written += size
            if written > length:
                return n
        return len(self.chars)

    def steps_within(self, length: int) -> int:
        """How many leading steps wrote their tokens inside the first ``length`` characters (a token that
        begins inside them counts)."""
        written = 0
        for n, size in enumerate(self.chars):
            if written >= length:
                return n
            written += size
        return len(self.chars)


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

    def __init__(self, token_strings: Sequence[str], end_ids: Sequence[int], inner: Any = None) -> None:
        self.inner = inner
        self.stats = DecodeStats()
        self._strings = token_strings
        self._end_ids = list(end_ids)
        self._logits: list[Any] = []  # each step's logits, as the model gave them
        self._chosen: list[int] = []  # the token chosen at each step but the last
        self._last_out: Any = None  # the last step's logits after inner's changes
        self._finished = False

    def __call__(self, generated_ids: Sequence[int], logits: Any) -> Any:
        if self._logits and generated_ids:
            self._chosen.append(int(generated_ids[-1]))
        self._logits.append(logits.detach().float().clone())  # inner may change its argument in place
        out = self.inner(generated_ids, logits) if self.inner is not None else logits
        self._last_out = out
        self._finished = False
        return out

    def finish(self) -> DecodeStats:
        """The stats of every step so far (the last one's token taken to be the likeliest); the
        distribution's figures for the first :data:`MAX_STEPS` steps (later ones have their token's
        length only)."""
        if self._finished or not self._logits:
            return self.stats
        import torch

        chosen = list(self._chosen[: len(self._logits) - 1])
        chosen.append(int(torch.argmax(self._last_out)))
        steps = torch.stack(self._logits[:MAX_STEPS])  # [S, V]
        count, vocab = steps.shape
        shifted = steps - steps.amax(dim=1, keepdim=True)
        exp = torch.exp(shifted)
        total = exp.sum(dim=1)
        lse = total.log()  # of the shifted logits
        first = chosen[:count]
        index = torch.tensor([c if 0 <= c < vocab else 0 for c in first], dtype=torch.long)
        picked = shifted.gather(1, index[:, None])[:, 0] - lse
        top = torch.exp(torch.topk(shifted, min(2, vocab), dim=1).values - lse[:, None])  # [S, 2]
        ends = torch.tensor([i for i in self._end_ids if i < vocab], dtype=torch.long)
        stats = self.stats
        stats.logprobs = [float(v) if 0 <= c < vocab else -math.inf for v, c in zip(picked.tolist(), first)]
        stats.entropies = (lse - (exp * shifted).sum(dim=1) / total).tolist()
        stats.top_probs = top[:, 0].tolist()
        stats.margins = (top[:, 0] - top[:, 1]).tolist() if top.shape[1] > 1 else top[:, 0].tolist()
        stats.end_probs = (exp.index_select(1, ends).sum(dim=1) / total).tolist() if len(ends) else [0.0] * count
        stats.chars = [len(self._strings[c]) if 0 <= c < len(self._strings) else 0 for c in chosen]
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
        self._local = threading.local()

    def wrap(self, factory: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
        def observed(target: Any) -> StepObserver:
            inner = factory(target) if factory is not None else None
            observer = StepObserver(self.token_strings, self.end_ids, inner)
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
