"""What a front end opens once and then sends requests to: a backend, the context engine, a pipeline.

:func:`open_session` creates the backend (``backends.factory.create_backend``: the in-process
runtime, an OpenAI-compatible server, llama.cpp's ``/infill`` or Ollama), loads its weights, sizes
the prompt to the model (:func:`context_budget`, :func:`line_context_budget`), builds the context
engine for the workspace behind one lock (:class:`SharedContext`) and wires the
:class:`~glm5_lsp.pipeline.core.Pipeline` over them. The server calls it on its model worker; the
command line front ends use :func:`create_backend` and :func:`context_engine` directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from glm5_lsp.backends.base import (  # noqa: F401 (front ends take these from here)
    Backend,
    BackendError,
    BackendUnavailable,
    Completion,
    CompletionRequest,
    capabilities,
)
from glm5_lsp.backends.factory import (  # noqa: F401 (front ends take these from here)
    add_backend_arguments,
    backend_from_args,
    backend_spec,
    create_backend,
)
from glm5_lsp.backends.local import LocalBackend  # noqa: F401
from glm5_lsp.backends.scoring import LOGPROB_FLOOR, RuntimeScorer, TokenScore, fit_to_text  # noqa: F401
from glm5_lsp.gate.acceptance import AcceptanceLog, SuggestionTracker  # noqa: F401 (front ends take these from here)
from glm5_lsp.gate.judge import CompletionGate
from glm5_lsp.pipeline.core import Pipeline, PipelineSettings
from glm5_lsp.pipeline.memory import MemorySettings, SessionMemory
from glm5_lsp.pynames.jedi import warm_jedi
from glm5_lsp.spans import Prompt

if TYPE_CHECKING:  # the context engine (jedi, bm25s) is imported when a session opens
    from glm5_lsp.context import ContextEngine

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, int], None]  # (message, percentage)

DEFAULT_CONTEXT_TOKENS = 1024  # the prompt budget when the model does not say what it was trained at
MIN_CONTEXT_TOKENS = 64


def context_engine(root: str | None = None, **options: Any) -> ContextEngine:
    """The context engine (API docs, symbol summaries, open files) for a workspace folder."""
    from glm5_lsp.context import ContextEngine

    return ContextEngine(workspace_root=root, **options)


def attention_config(**options: Any) -> Any:
    """The in-process runtime's attention policy settings (``model.AttentionConfig``; torch is
    imported only here, when a local model is really loaded)."""
    from glm5_lsp.model import AttentionConfig

    return AttentionConfig(**options)


def context_budget(context_tokens: int, trained_context: int | None, multiline_max_tokens: int) -> int:
    """The prompt's token budget: ``context_tokens`` when given (non-zero); otherwise what fits the model.

    A model reads contexts longer than it was trained on poorly (the embedded model's perplexity at
    four times its training length is 1.7x its perplexity at it) and every prompt token costs prefill
    time, so "auto" (0) keeps prompt plus a multi-line completion inside the trained context.
    """
    if context_tokens:
        return max(MIN_CONTEXT_TOKENS, context_tokens)
    if not trained_context:
        return DEFAULT_CONTEXT_TOKENS
    return max(MIN_CONTEXT_TOKENS, trained_context - multiline_max_tokens)


def line_context_budget(line_context_tokens: int, context_tokens: int, index_topk: int | None = None) -> int:
    """A single-line completion's prompt budget: ``line_context_tokens`` when given, else half of
    ``context_tokens``, and no more than half the model's DSA top-k (``index_topk``, when known): the
    prompt and the line written after it (``max_tokens``: 32 in the editor's settings, 64 in
    ``PipelineSettings``) then stay within one selection, so no step scores its keys with the indexer or attends through a gather. (For the
    embedded model, 64 tokens rather than 128: on 208 FIT cursors as exact and as often the right
    word, 6-8 ms sooner a request; the workspace memory reads the rest of the file.) At least
    ``MIN_CONTEXT_TOKENS``, at most ``context_tokens``."""
    wanted = line_context_tokens
    if not wanted:
        wanted = min(context_tokens // 2, index_topk // 2 if index_topk else context_tokens)
    return min(context_tokens, max(MIN_CONTEXT_TOKENS, wanted))


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


@dataclass
class Session:
    """An opened backend with its pipeline and context engine."""

    pipeline: Pipeline
    context: SharedContext | None
    context_tokens: int  # the prompt budget in use
    memory: SessionMemory | None = None  # the workspace memory (not indexed yet: ``memory.index(root)``)


def open_session(
    kind: str,
    options: dict[str, Any],
    settings: PipelineSettings,
    *,
    root: str | None = None,
    context_tokens: int = 0,
    line_context_tokens: int = 0,
    api_doc_tokens: int | None = None,
    symbol_tokens: int | None = None,
    snippet_tokens: int | None = None,
    warm_names: bool = False,
    progress: ProgressFn | None = None,
    # The completion gate: installed (``Pipeline.install_gate``) from the model's folder or ``gate_path``;
    # ``min_quality`` None is the gate's own threshold (gate.json). No gate found: every candidate shown.
    gate: bool = False,
    gate_path: str = "",
    min_quality: float | None = None,
    memory: MemorySettings | None = None,
    drafts: bool = True,
) -> Session:
    """Create and load the backend, size the prompts to it, build the context engine for ``root``
    and the pipeline over them. ``warm_names``: load jedi's builtins now (the decoding monitor's
    first lookup needs them). ``memory``: the workspace memory's settings (None or not ``enabled``:
    none), built empty here, in the model's tokens (a served model's: the embedded model's), for
    the front end to index (``session.memory.index(root, progress)``, slow: off its event loop);
    ``drafts``: the in-process model verifies the memory's drafts. Raises what the backend raises
    (a missing checkpoint, a bad URL)."""
    report = progress or (lambda message, percent: None)
    report(f"creating the {kind} backend", 5)
    backend = create_backend(kind, **options)
    able = capabilities(backend)
    if able.load is not None:
        report("loading the model weights", 20)
        able.load()
        able = capabilities(backend)  # what loading learnt (the trained context, DSA's top-k)
    report("preparing the context engine", 80)
    budget = context_budget(context_tokens, able.trained_context, settings.multiline_max_tokens)
    log.info("prompt budget: %d tokens", budget)
    engine_options = {k: v for k, v in (("api_doc_tokens", api_doc_tokens), ("symbol_tokens", symbol_tokens),
                                        ("snippet_tokens", snippet_tokens)) if v is not None}
    workspace_memory = None
    if memory is not None and memory.enabled:
        report("preparing the workspace memory", 85)
        workspace_memory = SessionMemory(memory_tokenizer(backend), memory, drafts=drafts)
        if hasattr(backend, "drafts"):
            backend.drafts = drafts

    def make(workspace: str | None) -> ContextEngine:
        return context_engine(workspace, token_budget=budget, memory=workspace_memory, **engine_options)

    context = SharedContext(make(root), make)
    line_budget = line_context_budget(line_context_tokens, budget, able.index_topk)
    pipeline = Pipeline(backend, settings=replace(settings, line_context_tokens=line_budget), context=context,
                        memory=workspace_memory)
    if gate:
        pipeline.install_gate(CompletionGate.for_model(getattr(backend, "model_path", None), path=gate_path or None,
                                                       min_quality=min_quality))
    if warm_names:
        report("warming jedi up", 90)
        started = time.perf_counter()
        try:
            warm_jedi("")  # Python's builtins
            log.debug("jedi's builtins loaded in %.0f ms", (time.perf_counter() - started) * 1000)
        except Exception:  # a warm-up: the first lookups pay for it instead; the model is loaded
            log.warning("jedi could not load Python's builtins ahead of the requests", exc_info=True)
    return Session(pipeline=pipeline, context=context, context_tokens=budget, memory=workspace_memory)


def memory_tokenizer(backend: Any) -> Any:
    """The tokenizer the workspace memory holds its ids in: the in-process model's (its logits are
    what the memory is mixed into), else the embedded model's (a served model's continuation is
    decoded back to text, so any tokenizer matches; this one ships)."""
    tokenizer = capabilities(backend, with_tokenizer=True).tokenizer if backend.supports_internals else None
    if tokenizer is None:
        from glm5_lsp.model import default_model_path, load_tokenizer

        tokenizer = load_tokenizer(default_model_path())
    return tokenizer
