"""``create_backend(kind, **options)``: the one place the server, batch and eval turn a name into a backend."""

from __future__ import annotations

import argparse
from typing import Any

from glm5_lsp.backends.base import Backend
from glm5_lsp.backends.fim import FAMILIES

KINDS: tuple[str, ...] = ("local", "openai", "llamacpp", "ollama")
FIM_CHOICES: tuple[str, ...] = ("auto", *FAMILIES, "server")


def create_backend(kind: str = "local", **options: Any) -> Backend:
    """A backend by name.

    - ``local``: ``model_path``, ``device`` (and ``LocalBackend``'s other options);
    - ``openai``: ``base_url`` (required), ``model``, ``api_key_env``, ``chat``, ``timeout`` (the whole
      request, retries included), ``max_retries``, ``fim``/``fim_template``/``fim_stop`` (the infilling
      layout, ``OpenAIHTTPBackend``'s docstring) and the circuit breaker's
      ``breaker_failures``/``breaker_cooldown_s``;
    - ``llamacpp`` (llama.cpp's ``/infill``) and ``ollama`` (``/api/generate``): ``base_url`` (default
      their usual local ports), ``model`` (required for Ollama), ``fim``/``fim_template``/``fim_stop``,
      ``timeout``, ``api_key_env`` and the options ``served.create_native_backend`` lists.

    Options set to ``None`` are dropped so callers can pass CLI values straight through. ``ValueError``
    for an unknown kind or an option the kind needs and lacks.
    """
    options = {key: value for key, value in options.items() if value is not None}
    if kind == "local":
        from glm5_lsp.backends.local import LocalBackend

        return LocalBackend(**options)
    if kind in ("openai", "http"):
        from glm5_lsp.backends.openai_http import OpenAIHTTPBackend

        if not options.get("base_url"):
            raise ValueError("the openai backend needs base_url (e.g. --base-url http://127.0.0.1:8000)")
        return OpenAIHTTPBackend(**options)
    if kind in ("llamacpp", "ollama"):
        from glm5_lsp.backends.served import create_native_backend

        return create_native_backend(kind, **options)
    raise ValueError(f"unknown backend {kind!r}; expected one of {KINDS}")


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """The backend options shared by ``generate``, ``batch`` and ``eval``."""
    group = parser.add_argument_group("backend")
    group.add_argument("--backend", choices=KINDS, default="local",
                       help="in-process runtime, an OpenAI-compatible server, llama.cpp's /infill or Ollama")
    group.add_argument("--model", default=None,
                       help="local: checkpoint folder (default: the embedded model); others: the served model's name")
    group.add_argument("--device", default="cpu", help="local: torch device")
    group.add_argument("--base-url", default=None,
                       help="served: server URL, e.g. http://127.0.0.1:8000 (llamacpp default :8080, ollama :11434)")
    group.add_argument("--api-key-env", default=None,
                       help="served: environment variable holding the API key (openai default GLM5_API_KEY)")
    group.add_argument("--chat", action="store_true", help="openai: use /v1/chat/completions")
    group.add_argument("--fim", default=None, choices=FIM_CHOICES, metavar="LAYOUT",
                       help="served: the infilling prompt layout, auto (from the model's name), a family "
                            f"({', '.join(FAMILIES[:-1])}), custom (--fim-template) or server (the server's own)")
    group.add_argument("--fim-template", default=None, metavar="TEXT",
                       help="with --fim custom: the template, {prefix} and {suffix} once each")
    group.add_argument("--fim-stop", action="append", default=None, metavar="TEXT",
                       help="with --fim custom: a stop string (repeat for more)")
    group.add_argument("--request-timeout", type=_positive, default=None, metavar="SECONDS",
                       help="served: the most one request may take, retries and waits included (default 60)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def backend_spec(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """``create_backend``'s kind and options for :func:`add_backend_arguments`' options (``ValueError``
    if they are incomplete or contradict each other). Batch workers rebuild the backend from these."""
    if args.backend == "local":
        return "local", {"model_path": args.model, "device": args.device}
    served = {
        "fim": getattr(args, "fim", None), "fim_template": getattr(args, "fim_template", None),
        "fim_stop": getattr(args, "fim_stop", None), "timeout": getattr(args, "request_timeout", None),
        "api_key_env": getattr(args, "api_key_env", None),
    }
    if args.backend == "openai":
        if not args.base_url:
            raise ValueError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000)")
        return "openai", {"base_url": args.base_url, "model": args.model or "glm-5", "chat": args.chat, **served}
    if getattr(args, "chat", False):
        raise ValueError(f"--chat is for --backend openai; --backend {args.backend} infills natively")
    if args.backend == "ollama" and not args.model:
        raise ValueError("--backend ollama needs --model (the Ollama model's name, e.g. qwen2.5-coder:1.5b-base)")
    return args.backend, {"base_url": args.base_url, "model": args.model or "", **served}


def backend_from_args(args: argparse.Namespace) -> Backend:
    """The backend described by :func:`add_backend_arguments`' options (``ValueError`` if incomplete)."""
    kind, options = backend_spec(args)
    return create_backend(kind, **options)
