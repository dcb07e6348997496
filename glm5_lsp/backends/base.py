"""The one interface every generator implements: the in-process runtime, a served GLM-5 over HTTP.

The pipeline, the repair loop, the server, ``batch`` and ``eval`` only ever talk to a
:class:`Backend`. Features that need the runtime's internals (the attention policy from
``Prompt.spans``, a ``logits_processor`` such as the decoding monitor) are honoured only where
``supports_internals`` is true; other backends ignore them and log that once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from glm5_lsp.spans import Prompt


class LogitsProcessor(Protocol):
    """Called once per decoding step with the ids generated so far and the next-token logits ``[V]``.

    Returns the (possibly modified) logits. Used by the repair layer's name monitor.
    """

    def __call__(self, generated_ids: Sequence[int], logits: object) -> object: ...


class BackendError(RuntimeError):
    """A request that cannot be served (bad input, a 4xx from a server, a model that will not load)."""


class BackendUnavailable(BackendError):
    """No answer to be had now: the server is down or unreachable, the request's deadline passed before
    it answered, or the circuit breaker is open after repeated failures.

    Not the request's fault, and nothing the user can fix by changing it: front ends answer it as an
    empty result (and say once that the model is unavailable), never as an error.
    """


@dataclass
class CompletionRequest:
    prompt: Prompt
    max_tokens: int = 128
    temperature: float = 0.0  # 0 is greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # Runtime-only features (ignored, with one log line, by backends without internals):
    use_attention_policy: bool = True
    logits_processor: LogitsProcessor | None = None
    # Streaming and cancellation, checked between tokens:
    on_text: Callable[[str], None] | None = None
    should_cancel: Callable[[], bool] | None = None
    # Stop at a token the model gives less than this probability, cut back to where the last word or
    # bracket ended (``GenerationConfig.min_token_prob``); the in-process runtime only, others ignore
    # it. 0: off.
    min_token_prob: float = 0.0
    # Token healing, where the backend says ``supports_forced_prefix``: the completion begins with
    # this text (returned and streamed as part of it), written in the model's own tokens.
    forced_prefix: str = ""
    # The whole request's time limit, a ``time.monotonic()`` instant, across retries and waits: the
    # HTTP backend, with no answer by then, raises :class:`BackendUnavailable` (text streamed so far
    # comes back as a ``cancelled`` completion). None: the backend's own limit. (The in-process
    # runtime is stopped through ``should_cancel``, into which the repair loop folds its deadline.)
    deadline: float | None = None
    # Hand out the model's per-step internals with the completion (``Completion.stats``), where the
    # backend has them (the in-process runtime); others ignore it.
    step_stats: bool = False


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" (stop string or end-of-text), "length", "cancelled", "unsure" (min_token_prob)
    logprob: float | None = None  # sum of the chosen tokens' log-probabilities, when known
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the previous request's cache
    seconds: float = 0.0
    # With ``CompletionRequest.step_stats``, where the backend has them: the runtime's per-step
    # statistics (``glm5_lsp.model.StepStats``: ``per_layer`` and ``per_step``, shaped and named as the
    # gate's ``DecodeStats`` fields of the same names). None otherwise.
    stats: Any = None


class Backend(Protocol):
    name: str
    supports_internals: bool

    def load(self) -> None:
        """Get ready before the first request (load weights, check the server); may raise BackendError."""
        ...

    def complete(self, request: CompletionRequest) -> Completion: ...
