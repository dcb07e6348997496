"""Token log-probabilities from the in-process runtime: what OpenAI's ``logprobs`` and ``echo`` return.

:class:`RuntimeScorer` scores a prompt in one forward pass and records each generated token's
log-probability (with the ``top`` alternatives) through a logits processor, on the backend's own
model and lock. ``serve-model`` formats them; a main model scoring a light model's candidates
reads them.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from glm5_lsp.backends.base import BackendError, Completion, CompletionRequest
from glm5_lsp.backends.local import LocalBackend
from glm5_lsp.spans import Prompt

if TYPE_CHECKING:  # torch and the runtime are imported on first use only
    from glm5_lsp.model import Generator

LOGPROB_FLOOR = -9999.0  # what OpenAI reports for a token the model rules out (JSON has no -inf)


def _floor(value: float) -> float:
    return LOGPROB_FLOOR if math.isnan(value) or value < LOGPROB_FLOOR else value


@dataclass(frozen=True)
class TokenScore:
    """One token of a scored text: its text, its log-probability given what precedes it (None for a
    text's first token) and the most likely tokens there (the chosen one among them), best first."""

    token: str
    logprob: float | None
    top: tuple[tuple[str, float], ...] | None = None
    token_id: int = -1


class Detokenizer:
    """Each token's own piece of a decoded text, one token at a time: a token that ends inside a
    character (byte-level BPE splits UTF-8) gets "" and the token that completes it gets the whole
    character, so the pieces join to the text. (The incremental scheme vLLM and TGI use: each token
    is decoded together with the one before, so a tokenizer's word-boundary rules see their context.)"""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.decode(self.ids[self._prefix:self._read])
        after = self.decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self.ids)
            return after[len(before):]
        return ""


def fit_to_text(scores: list[TokenScore], text: str) -> list[TokenScore]:
    """The tokens that make up ``text``: those past its end (a stop string cut it) dropped, the last
    one cut or extended so the pieces join to exactly ``text``."""
    kept: list[TokenScore] = []
    at = 0
    for score in scores:
        if at >= len(text) and (score.token or at > 0 or not text):
            break
        kept.append(score)
        at += len(score.token)
    if kept and at != len(text):
        last = kept[-1]
        start = at - len(last.token)
        kept[-1] = replace(last, token=text[start:])
    return kept


class _StepRecorder:
    """A logits processor that keeps each decoding step's distribution until the next step says which
    token was chosen (``generated_ids`` grows by it), then hands that token's score to ``on_scores``."""

    def __init__(self, scorer: RuntimeScorer, top: int, on_scores: Callable[[list[TokenScore]], None] | None) -> None:
        self.scorer, self.top, self.on_scores = scorer, top, on_scores
        self.scores: list[TokenScore] = []
        self.detokenizer = Detokenizer(lambda ids: scorer.tokenizer.decode(ids))
        self._last: Any = None  # the latest step's log-probabilities, its token not chosen yet

    def __call__(self, generated_ids: Any, logits: Any) -> Any:
        import torch

        if self._last is not None and len(generated_ids) > len(self.scores):
            self._chosen(int(generated_ids[len(self.scores)]))
        self._last = torch.log_softmax(logits.float(), dim=-1)
        return logits

    def _chosen(self, token_id: int) -> None:
        score = self.scorer.score_row(self._last, token_id, self.top, self.detokenizer.push(token_id))
        self._last = None
        self.scores.append(score)
        if self.on_scores is not None:
            self.on_scores([score])

    def finish(self, token_ids: list[int]) -> list[TokenScore]:
        """After generation: the last step's token (no step followed it to say which it was)."""
        if self._last is not None and len(token_ids) > len(self.scores):
            self._chosen(token_ids[len(self.scores)])
        return self.scores


class RuntimeScorer:
    """Token log-probabilities from the in-process runtime, for ``logprobs`` and ``echo``.

    A prompt is scored in one forward pass without a cache (the backend's cache, which keystrokes
    in one file reuse, is left alone), on the same attention policy generation uses, so
    a text's scores are the log-probabilities it would have had token by token as it was written.
    A generation with ``logprobs`` runs the backend's :class:`~glm5_lsp.model.Generator` with a
    logits processor that records each step. Both hold the backend's model lock.

    (It reads the backend's generator and lock, ``LocalBackend._generator`` and ``_lock``, beside
    the backend in this package: the runtime's one model, shared, rather than a second copy of the weights.)
    """

    ROWS_AT_ONCE = 256  # log-softmax over this many prompt positions at a time (a large vocabulary's memory)

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self._names: dict[int, str] = {}
        self._generator: Generator | None = None

    def _runtime(self) -> tuple[Generator, threading.Lock]:
        """The backend's generator (loaded) and its lock, which the caller takes (not held here)."""
        if self._generator is None:
            self.backend.load()
            self._generator = self.backend._generator  # the runtime's one model: see the class docstring
            assert self._generator is not None
        return self._generator, self.backend._lock

    @property
    def tokenizer(self) -> Any:
        return self._runtime()[0].tokenizer

    def name(self, token_id: int) -> str:
        """A token's text on its own (special tokens by their names), as alternatives are listed."""
        name = self._names.get(token_id)
        if name is None:
            name = self._names[token_id] = self.tokenizer.decode([token_id], skip_special=False)
        return name

    def score_row(self, logprobs: Any, token_id: int, top: int, piece: str) -> TokenScore:
        """``token_id``'s score in one position's log-probabilities ``[V]``, with the ``top`` best there."""
        import torch

        best: list[tuple[str, float]] = []
        if top:
            values, ids = torch.topk(logprobs, min(top, logprobs.shape[-1]))
            best = [(self.name(int(i)), _floor(float(v))) for v, i in zip(values, ids, strict=True)]
        chosen = _floor(float(logprobs[token_id]))
        if all(name != self.name(token_id) for name, _ in best):
            best.append((self.name(token_id), chosen))
        return TokenScore(piece, chosen, tuple(best), token_id)

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """The ids the runtime reads the prompt as (FIM tokens where it has a suffix)."""
        lock = self._runtime()[1]
        with lock:
            return self.backend.encode_prompt(prompt)[0]

    def score_prompt(self, prompt: Prompt, top: int) -> list[TokenScore]:
        """Each prompt token with its log-probability given the tokens before it (the first: None)."""
        generator, lock = self._runtime()
        with lock:
            ids = self.backend.encode_prompt(prompt)[0]
            return self._score(generator, ids, top)

    def score_ids(self, ids: list[int], top: int) -> list[TokenScore]:
        """:meth:`score_prompt` for token ids."""
        generator, lock = self._runtime()
        with lock:
            return self._score(generator, ids, top)

    def _score(self, generator: Generator, ids: list[int], top: int) -> list[TokenScore]:
        import torch

        if not ids:
            raise BackendError("empty prompt")
        model = generator.model
        current = getattr(model, "inference_current", None)
        if current is not None and not current():  # the weights changed since the runtime prepared them
            model.prepare_inference()
        device = next(model.parameters()).device
        detokenizer = Detokenizer(lambda part: generator.tokenizer.decode(part, skip_special=False))
        scores = [TokenScore(detokenizer.push(ids[0]), None, None, ids[0])]
        with torch.inference_mode():  # every position's logits, no cache: this text is scored once
            logits = model(torch.tensor([ids], dtype=torch.long, device=device), policy=generator.policy)[0]
            for start in range(0, len(ids) - 1, self.ROWS_AT_ONCE):  # row i predicts token i + 1
                rows = torch.log_softmax(logits[start:min(start + self.ROWS_AT_ONCE, len(ids) - 1)].float(), dim=-1)
                for offset, row in enumerate(rows):
                    token_id = ids[start + offset + 1]
                    scores.append(self.score_row(row, token_id, top, detokenizer.push(token_id)))
        return scores

    def generate(self, request: CompletionRequest, top: int,
                 on_scores: Callable[[list[TokenScore]], None] | None = None) -> tuple[Completion, list[TokenScore]]:
        """``request`` generated as ``LocalBackend.complete`` would, with each generated token's score
        (``on_scores`` hears them as they are known, one step behind the text)."""
        from glm5_lsp.model import GenerationConfig

        generator, lock = self._runtime()
        started = time.perf_counter()
        with lock:
            ids, roles = self.backend.encode_prompt(request.prompt)
            if not ids:
                raise BackendError("empty prompt")
            config = GenerationConfig(max_new_tokens=request.max_tokens, temperature=request.temperature,
                                      top_p=request.top_p, seed=request.seed, stop=list(request.stop))
            recorder = _StepRecorder(self, top, on_scores)
            generation = generator.generate(ids, config, roles=roles, logits_processor=recorder,
                                            on_text=request.on_text, should_cancel=request.should_cancel)
            scores = recorder.finish(generation.token_ids)
        completion = Completion(text=generation.text, finish_reason=generation.finish_reason, logprob=generation.logprob,
                                prompt_tokens=generation.prompt_tokens, completion_tokens=len(generation.token_ids),
                                cached_tokens=generation.cached_tokens, seconds=time.perf_counter() - started)
        return completion, fit_to_text(scores, completion.text)
