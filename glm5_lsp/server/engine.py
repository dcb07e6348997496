"""The model side of the server: one backend and one pipeline, loaded once, in the background.

:class:`Engine` turns :class:`~glm5_lsp.server.settings.Settings` into a backend
(``glm5_lsp.backends.factory.create_backend``) and a :class:`~glm5_lsp.pipeline.Pipeline` (which
runs the repair loop) with the context engine when the package provides one. ``load`` runs on the server's single
model worker as soon as the client is initialised, so every request queued behind it finds the
model loaded (or the reason it could not be).
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import Any, Callable

from glm5_lsp.pipeline import Pipeline, PipelineSettings
from glm5_lsp.repair.loop import RepairSettings
from glm5_lsp.server.settings import Settings

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, int], None]  # (message, percentage)


class EngineUnavailable(RuntimeError):
    """The model could not be loaded (the message says why); features answer empty meanwhile."""


def pipeline_settings(settings: Settings) -> PipelineSettings:
    """The server's settings mapped onto the pipeline's knobs (the repair loop's included)."""
    return PipelineSettings(
        max_tokens=settings.completion.max_tokens,
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
    """``create_backend``'s kind and options for the model settings."""
    model = settings.model
    if model.backend == "openai":
        return "openai", {
            "base_url": model.url,
            "model": model.name or "glm-5",
            "api_key_env": model.api_key_env,
            "chat": model.chat,
            "timeout": model.timeout_seconds,
        }
    return "local", {"model_path": model.path or None, "device": model.device}


class Engine:
    """Owns the backend and pipeline for one set of model settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pipeline: Pipeline | None = None
        self.context: Any | None = None
        self.error: str | None = None
        self.load_seconds = 0.0

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
            self.context = _make_context(self.settings)
            self.pipeline = Pipeline(
                backend,
                settings=pipeline_settings(self.settings),
                context=self.context,
            )
            self.load_seconds = time.perf_counter() - started
            report(f"model ready in {self.load_seconds:.1f}s", 100)
        except Exception as error:  # a missing checkpoint or a bad URL must not kill the server
            log.exception("model load failed")
            self.error = f"{type(error).__name__}: {error}"


def _make_context(settings: Settings) -> Any | None:
    """The context engine (API docs + symbol summaries) when the package provides one."""
    try:
        from glm5_lsp import context as context_package
    except ImportError:
        return None
    factory = getattr(context_package, "ContextEngine", None)
    if factory is None:
        return None
    accepted = inspect.signature(factory).parameters
    options = {
        name: value
        for name, value in {
            "token_budget": settings.budgets.context_tokens,
            "api_doc_tokens": settings.budgets.api_doc_tokens,
            "symbol_tokens": settings.budgets.symbol_tokens,
        }.items()
        if name in accepted
    }
    return factory(**options)
