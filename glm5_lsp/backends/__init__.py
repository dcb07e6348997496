"""Backends: one small interface (``base.Backend``) over the in-process runtime and served GLM-5."""

from glm5_lsp.backends.base import Backend, BackendError, Completion, CompletionRequest, LogitsProcessor
from glm5_lsp.backends.factory import create_backend

__all__ = ["Backend", "BackendError", "Completion", "CompletionRequest", "LogitsProcessor", "create_backend"]
