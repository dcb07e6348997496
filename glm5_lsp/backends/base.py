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
    """What every backend has. What only some have is read through :func:`capabilities`, never probed
    elsewhere."""

    name: str
    supports_internals: bool  # per-step logits (logits processors, step statistics): the in-process runtime

    def complete(self, request: CompletionRequest) -> Completion: ...


class Tokenizing(Protocol):
    """A backend that tokenizes as its model does (the in-process runtime)."""

    @property
    def tokenizer(self) -> Any: ...


class DecodingProcessor(Protocol):
    """A logits processor (``CompletionRequest.logits_processor``): called at each step with the
    ids so far and the logits, it returns the logits to sample from. The repair loop also tells it
    the healed word it must accept as a name (``expect_word``) and how long its lookups may still
    take (``time_left``, seconds), where it has them."""

    def __call__(self, token_ids: Sequence[int], logits: Any) -> Any: ...


@dataclass(frozen=True)
class Capabilities:
    """The optional parts of a backend, declared in one place (a backend or a test double that lacks
    one gets its default):

    - ``load``: get ready before the first request (load weights, check the server); may raise
      :class:`BackendError`;
    - ``forced_prefix``: it honours ``CompletionRequest.forced_prefix`` (token healing);
    - ``tokenizer``: the model's tokenizer, where it runs in this process;
    - ``trained_context``: the context length the model was trained at (the prompt budget follows it);
    - ``index_topk``: DSA's top-k (a single-line prompt is kept within it).
    """

    load: Callable[[], None] | None = None
    forced_prefix: bool = False
    tokenizer: Any = None
    trained_context: int | None = None
    index_topk: int | None = None


def capabilities(backend: Any, *, with_tokenizer: bool = False) -> Capabilities:
    """``backend``'s optional parts (see :class:`Capabilities`). ``with_tokenizer`` reads the
    tokenizer too (it may load the model: a :class:`BackendError` then propagates)."""
    load = getattr(backend, "load", None)
    return Capabilities(
        load=load if callable(load) else None,
        forced_prefix=bool(getattr(backend, "supports_forced_prefix", False)),
        tokenizer=getattr(backend, "tokenizer", None) if with_tokenizer else None,
        trained_context=getattr(backend, "trained_context", None),
        index_topk=getattr(backend, "index_topk", None),
    )


def expect_word(processor: Any, word: str) -> None:
    """Tell a decoding processor the healed word it must accept as a name, where it listens."""
    listen = getattr(processor, "expect_word", None)
    if callable(listen):
        listen(word)


def set_time_left(processor: Any, time_left: Callable[[], float]) -> None:
    """Give a decoding processor the request's remaining time, where it bounds its lookups by it."""
    if processor is not None and hasattr(processor, "time_left"):
        processor.time_left = time_left
