"""Backends: one small interface (``base.Backend``) over the in-process runtime and served GLM-5."""

from glm5_lsp.backends.base import Backend, BackendError, Completion, CompletionRequest, LogitsProcessor

__all__ = ["Backend", "BackendError", "Completion", "CompletionRequest", "LogitsProcessor"]
