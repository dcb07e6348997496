"""``create_backend(kind, **options)``: the one place the server, batch and eval turn a name into a backend."""

from __future__ import annotations

import argparse
from typing import Any

from glm5_lsp.backends.base import Backend

KINDS: tuple[str, ...] = ("local", "openai")


def create_backend(kind: str = "local", **options: Any) -> Backend:
    """A backend by name.

    ``local`` takes ``model_path`` and ``device``; ``openai`` takes ``base_url``, ``model``,
    ``api_key_env``, ``chat``, ``timeout`` (the whole request, retries included), ``max_retries``,
    ``fim`` and the circuit breaker's ``breaker_failures``/``breaker_cooldown_s`` (see
    ``OpenAIHTTPBackend``).
    Options set to ``None`` are dropped so callers can pass CLI values straight through.
    """
    options = {key: value for key, value in options.items() if value is not None}
    if kind == "local":
        from glm5_lsp.backends.local import LocalBackend

        return LocalBackend(**options)
    if kind in ("openai", "http"):
        from glm5_lsp.backends.openai_http import OpenAIHTTPBackend

        if "base_url" not in options:
            raise ValueError("the openai backend needs base_url (e.g. --base-url http://127.0.0.1:8000)")
        return OpenAIHTTPBackend(**options)
    raise ValueError(f"unknown backend {kind!r}; expected one of {KINDS}")


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """The backend options shared by ``batch`` and ``eval``."""
    group = parser.add_argument_group("backend")
    group.add_argument("--backend", choices=KINDS, default="local", help="in-process runtime or an OpenAI-compatible server")
    group.add_argument("--model", default=None, help="local: checkpoint folder (default: the embedded model); openai: model name")
    group.add_argument("--device", default="cpu", help="local: torch device")
    group.add_argument("--base-url", default=None, help="openai: server URL, e.g. http://127.0.0.1:8000")
    group.add_argument("--api-key-env", default="GLM5_API_KEY", help="openai: environment variable holding the API key")
    group.add_argument("--chat", action="store_true", help="openai: use /v1/chat/completions")
    group.add_argument("--request-timeout", type=_positive, default=None, metavar="SECONDS",
                       help="openai: the most one request may take, retries and waits included (default 60)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def backend_from_args(args: argparse.Namespace) -> Backend:
    """The backend described by :func:`add_backend_arguments`' options (``ValueError`` if incomplete)."""
    if args.backend == "local":
        return create_backend("local", model_path=args.model, device=args.device)
    if not args.base_url:
        raise ValueError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000)")
    return create_backend(
        "openai", base_url=args.base_url, model=args.model or "glm-5", api_key_env=args.api_key_env, chat=args.chat,
        timeout=getattr(args, "request_timeout", None),
    )
