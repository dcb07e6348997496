"""The model side of the server: one backend and one pipeline, loaded once, in the background.

:class:`Engine` turns :class:`~glm5_lsp.server.settings.Settings` into a backend
(``glm5_lsp.backends.factory.create_backend``) and a :class:`~glm5_lsp.pipeline.Pipeline` (which
runs the repair loop) with the context engine when the package provides one. ``load`` runs on the server's single
model worker as soon as the client is initialised, so every request queued behind it finds the
model loaded (or the reason it could not be).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from glm5_lsp.pipeline import Pipeline, PipelineSettings, RepairSettings
from glm5_lsp.pipeline.session import (
    MemorySettings,
    SessionMemory,
    SharedContext,
    attention_config,
    open_session,
)
from glm5_lsp.pipeline.session import context_budget as session_budget
from glm5_lsp.pipeline.session import line_context_budget as session_line_budget
from glm5_lsp.server.heap import settle_heap
from glm5_lsp.server.settings import EMBEDDED_MIN_QUALITY, Settings

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
        reindent=True,  # multi-line text in the file's indentation unit, judged as inserted
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

    attention = settings.attention
    return "local", {
        "model_path": model.path or None,
        "device": model.device,
        "attention": attention_config(
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
        self.memory: SessionMemory | None = None  # the workspace memory, once loaded (indexed by the server)
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
            if self.pipeline.gate is not None:
                self.pipeline.gate.set_min_quality(min_quality(settings))

    @property
    def monitors_names(self) -> bool:
        """Whether completions run the decoding monitor (and so jedi): it is on, and the model runs in
        this process (a served model's backend gives no logits to mask)."""
        return self.settings.repair.monitor and self.settings.model.backend == "local"

    def load(self, progress: ProgressFn | None = None) -> None:
        """Create the backend, load the weights, wire the pipeline. Never raises: sets ``error``."""
        started = time.perf_counter()
        try:
            kind, options = backend_options(self.settings)
            budgets = self.settings.budgets
            session = open_session(
                kind, options, pipeline_settings(self.settings), root=self.root,
                context_tokens=budgets.context_tokens, line_context_tokens=budgets.line_context_tokens,
                api_doc_tokens=budgets.api_doc_tokens, symbol_tokens=budgets.symbol_tokens,
                snippet_tokens=budgets.snippet_tokens,
                warm_names=self.monitors_names, progress=progress,
                gate=True, gate_path=self.settings.completion.gate_path, min_quality=min_quality(self.settings),
                memory=memory_settings(self.settings), drafts=self.settings.memory.drafts,
            )
            self.memory = session.memory
            self.context_tokens = session.context_tokens
            self.context = session.context
            self.pipeline = session.pipeline
            settle_heap()
            self.load_seconds = time.perf_counter() - started
            if progress is not None:
                progress(f"model ready in {self.load_seconds:.1f}s", 100)
        except Exception as error:  # a missing checkpoint or a bad URL must not kill the server
            log.exception("model load failed")
            self.error = f"{type(error).__name__}: {error}"


def memory_settings(settings: Settings) -> MemorySettings:
    """The workspace memory's settings (``memory.*``) in the pipeline's terms."""
    memory = settings.memory
    return MemorySettings(enabled=memory.enabled, libraries=memory.libraries, stdlib=memory.stdlib,
                          max_files=memory.max_files, max_library_tokens=memory.max_library_tokens,
                          shorter_suffixes=memory.shorter_suffixes)


def min_quality(settings: Settings) -> float | None:
    """``completion.minQuality`` for the gate: None (the gate's own threshold, gate.json) while it is
    left at its default, the embedded model's gate's threshold."""
    value = settings.completion.min_quality
    return None if value == EMBEDDED_MIN_QUALITY else value


def context_budget(settings: Settings, trained_context: int | None) -> int:
    """The prompt's token budget for these settings (``pipeline.session.context_budget``)."""
    return session_budget(settings.budgets.context_tokens, trained_context, settings.completion.multiline_max_tokens)


def line_context_budget(settings: Settings, context_tokens: int, index_topk: int | None = None) -> int:
    """A single-line completion's prompt budget for these settings (``pipeline.session.line_context_budget``)."""
    return session_line_budget(settings.budgets.line_context_tokens, context_tokens, index_topk)
