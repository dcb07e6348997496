"""The model side of the server: one backend and one pipeline, loaded once, in the background.

:class:`Engine` turns :class:`~glm5_lsp.server.settings.Settings` into a backend
(``glm5_lsp.backends.factory.create_backend``) and a :class:`~glm5_lsp.pipeline.Pipeline` (which
runs the repair loop) with the context engine when the package provides one. ``load`` runs on the server's single
model worker as soon as the client is initialised, so every request queued behind it finds the
model loaded (or the reason it could not be).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from glm5_lsp.pipeline import Pipeline, PipelineSettings
from glm5_lsp.pynames.jedi import warm_jedi
from glm5_lsp.repair.loop import RepairSettings
from glm5_lsp.server.heap import settle_heap
from glm5_lsp.server.settings import DEFAULT_CONTEXT_TOKENS, MIN_CONTEXT_TOKENS, Settings
from glm5_lsp.spans import Prompt

if TYPE_CHECKING:  # the context engine (jedi, bm25s) is imported when the model loads
    from glm5_lsp.context import ContextEngine

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, int], None]  # (message, percentage)


class EngineUnavailable(RuntimeError):
    """The model could not be loaded (the message says why); features answer empty meanwhile."""


def pipeline_settings(settings: Settings) -> PipelineSettings:
    """The server's settings mapped onto the pipeline's knobs (the repair loop's included)."""
    return PipelineSettings(
        max_tokens=settings.completion.max_tokens,
        min_token_prob=settings.completion.min_token_prob,
        multiline_max_tokens=settings.completion.multiline_max_tokens,
        temperature=settings.completion.temperature,
        use_attention_policy=settings.model.backend == "local",
        repair=RepairSettings(
            max_rounds=settings.repair.max_rounds,
            time_budget_s=settings.budgets.request_timeout_ms / 1000,
            return_unclean=settings.repair.return_unclean,
            monitor=None if settings.repair.monitor else False,  # None: on where supported (Python)
        ),
    )


def backend_options(settings: Settings) -> tuple[str, dict[str, Any]]:
    """``create_backend``'s kind and options for the model settings: the same backends, infilling
    layouts and checks as the command line's ``--backend``/``--fim`` (``factory.backend_spec``).

    ``ValueError`` (shown to the user as the reason the model could not be loaded) for settings that
    contradict each other: ``openai`` without ``model.url``, ``ollama`` without ``model.name``,
    ``model.chat`` with a native protocol, ``model.fim`` ``custom`` without ``model.fimTemplate``.
    """
    model = settings.model
    if model.backend in ("openai", "llamacpp", "ollama"):
        if model.fim == "custom" and not model.fim_template:
            raise ValueError("model.fim is 'custom' but model.fimTemplate is empty: set the template "
                             "({prefix} and {suffix} once each) or pick a family")
        served: dict[str, Any] = {
            "api_key_env": model.api_key_env, "timeout": model.timeout_seconds, "fim": model.fim,
            "fim_template": model.fim_template, "fim_stop": tuple(model.fim_stop),
        }
        if model.backend == "openai":
            if not model.url:
                raise ValueError("model.backend 'openai' needs model.url, e.g. http://127.0.0.1:8000/v1")
            return "openai", {"base_url": model.url, "model": model.name or "glm-5", "chat": model.chat, **served}
        if model.chat:
            raise ValueError(f"model.chat is for model.backend 'openai'; '{model.backend}' infills natively")
        if model.backend == "ollama" and not model.name:
            raise ValueError("model.backend 'ollama' needs model.name, the Ollama model (e.g. qwen2.5-coder:1.5b-base)")
        return model.backend, {"base_url": model.url, "model": model.name, **served}
    from glm5_lsp.model import AttentionConfig  # torch: only when a local model is really loaded

    attention = settings.attention
    return "local", {
        "model_path": model.path or None,
        "device": model.device,
        "attention": AttentionConfig(
            global_sparsity=attention.global_sparsity, syntax_aware=attention.syntax_aware,
            api_focus=attention.api_focus, error_context=attention.error_context, indent_flow=attention.indent_flow,
        ),
    }


class Engine:
    """Owns the backend and pipeline for one set of model settings."""

    def __init__(self, settings: Settings, root: str | None = None) -> None:
        self.settings = settings
        self.root = root
        self.pipeline: Pipeline | None = None
        self.context: SharedContext | None = None
        self.error: str | None = None
        self.load_seconds = 0.0
        self.context_tokens = 0  # the prompt budget in use, once loaded

    def update_settings(self, settings: Settings) -> None:
        """Settings that need no reload (completion lengths, temperature, the unsure stop) take effect
        from the next request; what loading worked out (the single-line prompt budget) is kept."""
        self.settings = settings
        if self.pipeline is not None:
            line_budget = self.pipeline.settings.line_context_tokens
            self.pipeline.settings = replace(pipeline_settings(settings), line_context_tokens=line_budget)

    @property
    def monitors_names(self) -> bool:
        """Whether completions run the decoding monitor (and so jedi): it is on, and the model runs in
        this process (a served model's backend gives no logits to mask)."""
        return self.settings.repair.monitor and self.settings.model.backend == "local"

    def load(self, progress: ProgressFn | None = None) -> None:
        """Create the backend, load the weights, wire the pipeline. Never raises: sets ``error``."""
        report = progress or (lambda message, percent: None)
        started = time.perf_counter()
        try:
            from glm5_lsp.backends.factory import create_backend

            kind, options = backend_options(self.settings)
            report(f"creating the {kind} backend", 5)
            backend = create_backend(kind, **options)
            loader = getattr(backend, "load", None)
            if callable(loader):
                report("loading the model weights", 20)
                loader()
            report("preparing the context engine", 80)
            self.context_tokens = context_budget(self.settings, getattr(backend, "trained_context", None))
            log.info("prompt budget: %d tokens", self.context_tokens)
            self.context = _make_context(self.settings, self.root, self.context_tokens)
            self.pipeline = Pipeline(
                backend,
                settings=replace(pipeline_settings(self.settings), line_context_tokens=line_context_budget(
                    self.settings, self.context_tokens, getattr(backend, "index_topk", None))),
                context=self.context,
            )
            if self.monitors_names:
                report("warming jedi up", 90)
                warm_jedi("")  # Python's builtins: the decoding monitor's lookups need them from the first one
            settle_heap()
            self.load_seconds = time.perf_counter() - started
            report(f"model ready in {self.load_seconds:.1f}s", 100)
        except Exception as error:  # a missing checkpoint or a bad URL must not kill the server
            log.exception("model load failed")
            self.error = f"{type(error).__name__}: {error}"


class SharedContext:
    """The context engine behind one lock: the model worker builds prompts while list completions
    ask for names from other threads. Re-indexing builds a fresh engine without the lock and swaps
    it in, so a large workspace never holds up a completion."""

    def __init__(self, engine: ContextEngine, make: Callable[[str | None], ContextEngine]) -> None:
        self.engine = engine
        self._make = make
        self._lock = threading.Lock()

    def build_prompt(self, text: str, offset: int, *, path: str | None = None, language: str | None = None,
                     budget_tokens: int | None = None) -> Prompt:
        with self._lock:
            return self.engine.build_prompt(text, offset, path=path, language=language, budget_tokens=budget_tokens)

    def names_at(self, text: str, offset: int, *, path: str | None = None, language: str | None = None) -> list[Any]:
        with self._lock:
            return list(self.engine.names_at(text, offset, path=path, language=language))

    def reindex(self, root: str) -> int:
        """Index ``root`` in a new engine (slow, unlocked), then make it the current one."""
        fresh = self._make(root)
        count = fresh.reindex(root)
        with self._lock:
            self.engine = fresh  # open documents are re-opened from the next request's text
        return count

    def open_document(self, path: str, text: str, language_id: str | None) -> None:
        """Tell the engine about an open file (other open files are context for the current one)."""
        with self._lock:
            self.engine.open_document(path, text, language_id)

    def warm(self, path: str) -> int:
        """Index the packages an opened file imports that the index lacks, and resolve its imports.

        Reading a package's API (the slow part) runs outside the lock, under the API-doc index's
        own; completions keep being served meanwhile. Returns the packages added.
        """
        with self._lock:
            engine = self.engine
            modules = engine.packages_to_index(path)
        for module in modules:
            engine.apidocs.add_package(module)
        engine.apidocs.ensure_index()
        with self._lock:
            if self.engine is engine:  # not replaced by a re-index meanwhile
                engine.resolve_imports(path)
        return len(modules)

    def close_document(self, path: str) -> None:
        with self._lock:
            if self.engine.documents.get(path) is not None:
                self.engine.close_document(path)


def context_budget(settings: Settings, trained_context: int | None) -> int:
    """The prompt's token budget: the setting when given; otherwise what fits the model.

    A model reads contexts longer than it was trained on poorly (the embedded model's perplexity at
    four times its training length is 1.7x its perplexity at it) and every prompt token costs prefill
    time, so "auto" (0) keeps prompt plus a multi-line completion inside the trained context.
    """
    if settings.budgets.context_tokens:
        return max(MIN_CONTEXT_TOKENS, settings.budgets.context_tokens)
    if not trained_context:
        return DEFAULT_CONTEXT_TOKENS
    return max(MIN_CONTEXT_TOKENS, trained_context - settings.completion.multiline_max_tokens)


def line_context_budget(settings: Settings, context_tokens: int, index_topk: int | None = None) -> int:
    """A single-line completion's prompt budget: the setting when given, else half of ``context_tokens``,
    and no more than the model's DSA top-k (``index_topk``, when known): past it every prompt token is
    scored by the indexer and attends through a gather (the embedded model's prefill: 16 ms at 128
    tokens, its top-k; 27 ms at 192). At least ``MIN_CONTEXT_TOKENS``, at most ``context_tokens``."""
    wanted = settings.budgets.line_context_tokens
    if not wanted:
        wanted = min(context_tokens // 2, index_topk or context_tokens)
    return min(context_tokens, max(MIN_CONTEXT_TOKENS, wanted))


def _make_context(settings: Settings, root: str | None, token_budget: int) -> SharedContext:
    """The context engine (API docs + symbol summaries) for the workspace."""
    from glm5_lsp.context import ContextEngine

    def make(workspace: str | None) -> ContextEngine:
        return ContextEngine(
            workspace_root=workspace,
            token_budget=token_budget,
            api_doc_tokens=settings.budgets.api_doc_tokens,
            symbol_tokens=settings.budgets.symbol_tokens,
        )

    return SharedContext(make(root), make)
