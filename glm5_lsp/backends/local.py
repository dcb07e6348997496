"""The in-process backend: the project's own GLM-5 runtime on a local checkpoint.

The model and tokenizer load lazily on the first request (so constructing a backend is free). One
:class:`~glm5_lsp.model.Generator` is kept for the backend's life, so consecutive requests that
share a prompt prefix (keystrokes in one file) reuse its KV cache. One lock serialises the model:
requests from several threads are safe and run one at a time.

A request whose logits processor is a workspace-memory processor (``glm5_lsp.memory``: it has
``bind_prompt``) is handed the prompt's ids before decoding, and, unless ``drafts`` is off, its
``propose`` becomes the generator's drafter (the memory's continuation verified in one forward
pass). Processors run in one order: the memory's mixing, then the decoding monitor it wraps
(``then``), then token healing's forced prefix around both.

A request with ``step_stats`` gets the runtime's per-step statistics back as ``Completion.stats``
(``glm5_lsp.model.StepStats``; one entry per decoding step, as a logits processor sees the steps).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glm5_lsp.backends.base import BackendError, Completion, CompletionRequest
from glm5_lsp.spans import ROLE_NAMES, Prompt

if TYPE_CHECKING:  # torch and the runtime are imported on first use only
    from glm5_lsp.model import AttentionConfig, Generator, Tokenizer

log = logging.getLogger(__name__)


def token_roles(prompt: Prompt, offsets: Sequence[tuple[int, int]], shift: int = 0) -> list[int]:
    """Per-token role ids from the prompt's character spans.

    ``offsets[i]`` is token ``i``'s character range in the encoded text, which starts at character
    ``shift`` of ``prompt.text()``. A token takes the role of its first character; a token spanning
    an ``error_context`` character anywhere takes ``error_context`` (never dropped by sparsity).
    """
    text_roles = _character_roles(prompt)
    error = ROLE_NAMES.index("error_context")
    roles = []
    for start, end in offsets:
        lo, hi = start + shift, max(end + shift, start + shift + 1)
        window = text_roles[lo:hi]
        if not window:
            roles.append(0)
        elif error in window:
            roles.append(error)
        else:
            roles.append(window[0])
    return roles


def _character_roles(prompt: Prompt) -> list[int]:
    roles = [0] * len(prompt.text())
    for span in prompt.spans:  # later spans override earlier ones, as in Prompt.role_at
        role = ROLE_NAMES.index(span.role)
        end = min(span.end, len(roles))
        roles[span.start:end] = [role] * max(0, end - span.start)
    return roles


_BY_FIRST: list[tuple[Sequence[str], dict[str, list[int]]]] = []  # the last vocabulary, held: its id stays its own


def _tokens_by_first_char(token_strings: Sequence[str]) -> dict[str, list[int]]:
    """Token ids by their text's first character, built once per vocabulary list (``token_strings()``
    returns the tokenizer's own cached list) rather than once per request."""
    if not _BY_FIRST or _BY_FIRST[0][0] is not token_strings:
        index: dict[str, list[int]] = {}
        for token_id, piece in enumerate(token_strings):
            if piece:
                index.setdefault(piece[0], []).append(token_id)
        _BY_FIRST[:] = [(token_strings, index)]
    return _BY_FIRST[0][1]


class ForcedPrefix:
    """A logits processor that makes generation begin with ``text`` (token healing).

    A prompt that ends inside a word (``namespace, va``) splits it where the model's tokenizer
    never would, and a small model then rarely continues the word. The caller cuts the word off the
    prompt and passes it here: until the generated text covers it, only tokens that agree with the
    rest of it are allowed (``va`` itself, or ``values``, which runs past it); ``inner`` (the
    decoding monitor) runs first and sees every token, the forced ones included. A token that ends
    inside the text ends where the tokenizer's own tokens of it do (``boundaries``: their end
    offsets; None allows any), so the text is spelled as the model read such text in training
    (`` return``, not `` r`` + ``e`` + ``turn``). A text that ends with a space (a healed
    `` return ``) ends inside the token after it, as the tokenizer would have it: the space begins
    the next word's token (`` a``), never a token of its own or a longer space.
    """

    def __init__(self, text: str, token_strings: Sequence[str], inner: Any = None,
                 boundaries: Iterable[int] | None = None) -> None:
        self.text = text
        self.strings = token_strings
        self.inner = inner
        self.boundaries = None if boundaries is None else frozenset(boundaries)
        self._by_first = _tokens_by_first_char(token_strings)

    def __call__(self, generated_ids: Sequence[int], logits: Any) -> Any:
        import torch

        raw = logits
        if self.inner is not None:
            logits = self.inner(generated_ids, logits)
        produced = "".join(self.strings[i] if 0 <= i < len(self.strings) else "" for i in generated_ids)
        if len(produced) >= len(self.text):
            return logits
        rest = self.text[len(produced):]
        allowed = [i for i in self._by_first.get(rest[0], ())
                   if i < logits.shape[-1] and self._agrees(self.strings[i], rest, len(produced))]
        if not allowed:  # no token agrees (an odd vocabulary): leave the model free
            return logits
        keep = torch.full_like(logits, float("-inf"))
        index = torch.tensor(allowed, dtype=torch.long)
        keep[index] = logits[index]
        if torch.isinf(keep[index]).all():  # the inner processor banned every agreeing token: it yields
            keep[index] = raw[index]
        return keep

    def _agrees(self, token: str, rest: str, done: int) -> bool:
        if rest.startswith(token):  # it ends inside the text, or at its end
            if len(token) == len(rest):
                return not rest.endswith(" ")
            return self.boundaries is None or done + len(token) in self.boundaries
        return token.startswith(rest) and not (rest.endswith(" ") and token[len(rest)].isspace())


class LocalBackend:
    """:class:`~glm5_lsp.backends.base.Backend` over ``glm5_lsp.model`` (attention policy, logits
    processor, forced prefixes for token healing)."""

    name = "local"
    supports_internals = True
    supports_forced_prefix = True

    def __init__(self, model_path: str | Path | None = None, device: str = "cpu", use_fim: bool = True,
                 attention: AttentionConfig | None = None, drafts: bool = True) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.device = device
        self.use_fim = use_fim
        self.drafts = drafts  # the memory processor's drafts, verified in one pass (same greedy text)
        self.attention = attention  # the policy's knobs; None: the runtime's defaults
        self._policy: Any = None
        self._lock = threading.Lock()
        self._generator: Generator | None = None
        self._tokenizer: Tokenizer | None = None
        self._last_encoded: tuple[Prompt, list[int], list[int]] | None = None

    # ---- loading ------------------------------------------------------------------------

    def load(self) -> None:
        """Load the model and tokenizer now (otherwise the first request does)."""
        with self._lock:
            self._ensure_loaded()

    def _ensure_loaded(self) -> Generator:
        if self._generator is not None:
            return self._generator
        if self.model_path is not None and not (self.model_path / "config.json").is_file():
            raise BackendError(f"no checkpoint at {self.model_path} (config.json missing); pass --model PATH")
        try:
            from glm5_lsp import model as runtime

            path = self.model_path or Path(runtime.default_model_path())
        except ImportError as error:  # pragma: no cover - the runtime ships with the package
            raise BackendError(f"the GLM-5 runtime is not available: {error}") from error
        except FileNotFoundError as error:
            raise BackendError(str(error)) from error
        started = time.perf_counter()
        try:
            model = runtime.load_model(path, device=self.device)
            tokenizer = runtime.load_tokenizer(path)
        except (OSError, ValueError, KeyError) as error:  # CheckpointError and ConfigError are ValueErrors
            raise BackendError(f"cannot load the checkpoint at {path}: {error}") from error
        model.eval()
        self._tokenizer = tokenizer
        self._policy = runtime.AttentionPolicy.from_config(self.attention)
        self._generator = runtime.Generator(model, tokenizer, policy=self._policy)
        self.model_path = Path(path)
        log.info("loaded %s on %s in %.1fs", path, self.device, time.perf_counter() - started)
        return self._generator

    def _token_strings(self) -> Sequence[str]:
        assert self._tokenizer is not None
        return self._tokenizer.token_strings()

    @property
    def trained_context(self) -> int | None:
        """The sequence length the checkpoint was trained at, when its folder says so.

        ``glm5-lsp train`` writes it as ``seq_len`` in ``metrics.json`` beside the weights; a
        checkpoint from elsewhere has no such file (None: the caller picks a budget).
        """
        folder = self.model_path
        if folder is None:
            try:
                from glm5_lsp.model import default_model_path

                folder = Path(default_model_path())
            except (ImportError, FileNotFoundError):
                return None
        try:
            value = json.loads((folder / "metrics.json").read_text(encoding="utf-8")).get("seq_len")
        except (OSError, ValueError, AttributeError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @property
    def index_topk(self) -> int | None:
        """How many keys DSA's indexer keeps per query once loaded (None before): a prompt no longer
        than this attends to all of itself, and its prefill skips the indexer's scoring and selection."""
        generator = self._generator
        return generator.model.config.index_topk if generator is not None else None

    @property
    def tokenizer(self) -> Tokenizer:
        with self._lock:
            self._ensure_loaded()
        assert self._tokenizer is not None
        return self._tokenizer

    # ---- prompts ------------------------------------------------------------------------

    def encode_prompt(self, prompt: Prompt) -> tuple[list[int], list[int]]:
        """Token ids for the prompt (FIM form when there is a suffix and FIM tokens) and their roles.

        A blank suffix (the cursor at the end of the file: ``"\\n"``) is left to right: it says nothing
        the model can use, and the embedded model predicts far worse in FIM form there (on 77 FIT-package
        cursors after a space, the file cut below them: -3.98 nats a token with the suffix ``"\\n"``
        against -3.18 without, worse at 73 of them)."""
        tokenizer = self._tokenizer
        assert tokenizer is not None
        has_fim = None not in (tokenizer.fim_prefix_id, tokenizer.fim_suffix_id, tokenizer.fim_middle_id)
        if prompt.suffix.strip() and has_fim and self.use_fim:
            prefix_ids, prefix_offsets = tokenizer.encode_with_offsets(prompt.prefix)
            suffix_ids, suffix_offsets = tokenizer.encode_with_offsets(prompt.suffix)
            ids = tokenizer.fim_prompt_ids(prompt.prefix, prompt.suffix)
            expected = [tokenizer.fim_prefix_id, *prefix_ids, tokenizer.fim_suffix_id, *suffix_ids,
                        tokenizer.fim_middle_id]
            if ids != expected:  # the tokenizer lays FIM out differently: roles stay plain code
                return ids, [0] * len(ids)
            roles = [0, *token_roles(prompt, prefix_offsets), 0,
                     *token_roles(prompt, suffix_offsets, shift=len(prompt.prefix)), 0]
            return ids, roles
        ids, offsets = tokenizer.encode_with_offsets(prompt.prefix)  # left to right; the suffix is unused
        return ids, token_roles(prompt, offsets)

    def _encoded(self, prompt: Prompt) -> tuple[list[int], list[int]]:
        """``encode_prompt``, remembered for the last prompt (``prefetch`` encodes what ``complete`` will)."""
        held = self._last_encoded
        if held is not None and held[0] is prompt:
            return held[1], held[2]
        ids, roles = self.encode_prompt(prompt)
        self._last_encoded = (prompt, ids, roles)
        return ids, roles

    # ---- Backend --------------------------------------------------------------------------

    def prefetch(self, request: CompletionRequest) -> bool:
        """Start the request's prompt prefill (all but its last token) on the runtime's C worker and
        return at once (``Generator.prefetch``): the caller's work before it asks :meth:`complete`
        (the memory's line, the checks, the processors' setup) then runs beside it. False where it
        could not start (the prompt is held already, or the C path does not apply)."""
        with self._lock:
            generator = self._ensure_loaded()
            ids, roles = self._encoded(request.prompt)
            if len(ids) < 2:
                return False
            generator.policy = self._policy if request.use_attention_policy else None
            return generator.prefetch(ids, roles if request.use_attention_policy else None)

    def complete(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        with self._lock:
            generator = self._ensure_loaded()
            from glm5_lsp.model import GenerationConfig

            ids, roles = self._encoded(request.prompt)
            if not ids:
                raise BackendError("empty prompt")
            config = GenerationConfig(
                max_new_tokens=request.max_tokens, temperature=request.temperature, top_p=request.top_p,
                seed=request.seed, stop=list(request.stop), min_token_prob=request.min_token_prob,
                step_stats=request.step_stats,
            )
            # The policy only changes which keys DSA selects, never the cached keys: safe to toggle per request.
            generator.policy = self._policy if request.use_attention_policy else None
            processor = request.logits_processor
            memory = processor if hasattr(processor, "bind_prompt") else None
            if memory is not None:
                memory.bind_prompt(ids, stop=request.stop)
            drafter = memory.propose if memory is not None and self.drafts and hasattr(memory, "propose") else None
            if request.forced_prefix:
                _, offsets = self._tokenizer.encode_with_offsets(request.forced_prefix)
                processor = ForcedPrefix(request.forced_prefix, self._token_strings(), processor,
                                         boundaries=[end for _, end in offsets])
            generation = generator.generate(
                ids, config, roles=roles if request.use_attention_policy else None,
                logits_processor=processor, on_text=request.on_text,
                should_cancel=request.should_cancel, drafter=drafter,
            )
        return Completion(
            text=generation.text, finish_reason=generation.finish_reason, logprob=generation.logprob,
            prompt_tokens=generation.prompt_tokens, completion_tokens=len(generation.token_ids),
            cached_tokens=generation.cached_tokens, seconds=time.perf_counter() - started,
            stats=generation.stats,
        )
