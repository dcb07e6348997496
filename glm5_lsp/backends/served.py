"""The native protocol clients by name, for ``factory.create_backend`` to call.

    create_native_backend("llamacpp", base_url="http://127.0.0.1:8080")
    create_native_backend("ollama", base_url="http://127.0.0.1:11434", model="qwen2.5-coder:1.5b-base")

``fim`` picks the infilling layout where this side renders the prompt (``backends/fim.py``):
``auto`` (the default) detects the family from the model's name; a family name forces it;
``custom`` uses ``fim_template``/``fim_stop``; ``server`` leaves the layout to the server.

- **llamacpp**: llama.cpp's ``/infill`` always lets the server lay the prompt out (from the GGUF's
  own FIM tokens), so ``fim`` only adds the family's stop strings (a GGUF whose FIM tokens are not
  marked as end-of-generation still stops at them).
- **ollama**: with a template (``auto`` that detects a family, a family, or ``custom``) the prompt is
  rendered here and sent ``raw``; otherwise (``server``, or ``auto`` on a name it cannot place) it
  goes as ``prompt``/``suffix`` and Ollama applies the model's own template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from glm5_lsp.backends.base import Backend
from glm5_lsp.backends.fim import FimTemplate, detect_family, template_for

NATIVE_KINDS: tuple[str, ...] = ("llamacpp", "ollama")
DEFAULT_URLS = {"llamacpp": "http://127.0.0.1:8080", "ollama": "http://127.0.0.1:11434"}


def native_template(fim: str, model: str, fim_template: str = "", fim_stop: Sequence[str] = ()) -> FimTemplate | None:
    """The template the client renders with, or None to leave the layout to the server."""
    fim = (fim or "auto").strip().lower()
    if fim == "server" or (fim == "auto" and detect_family(model) is None):
        return None
    return template_for(fim, model, fim_template, fim_stop)


def create_native_backend(kind: str, base_url: str = "", model: str = "", fim: str = "auto", fim_template: str = "",
                          fim_stop: Sequence[str] = (), timeout: float | None = None, api_key_env: str = "",
                          **options: Any) -> Backend:
    """A llama.cpp ``/infill`` or Ollama ``/api/generate`` backend (``ValueError`` on a bad name or template).

    ``options`` go to the client: ``max_retries``, ``backoff``, ``breaker_failures``,
    ``breaker_cooldown_s``; llama.cpp's ``cache_prompt``; Ollama's ``keep_alive``, ``num_ctx``.
    """
    template = native_template(fim, model, fim_template, fim_stop)
    url = base_url or DEFAULT_URLS.get(kind, "")
    if timeout is not None:
        options["timeout"] = timeout
    if kind == "llamacpp":
        from glm5_lsp.backends.llamacpp_infill import LlamaCppInfillBackend

        return LlamaCppInfillBackend(url, model=model, api_key_env=api_key_env,
                                     extra_stop=template.stop if template is not None else (), **options)
    if kind == "ollama":
        from glm5_lsp.backends.ollama import OllamaBackend

        return OllamaBackend(url, model=model, template=template, api_key_env=api_key_env, **options)
    raise ValueError(f"unknown native backend {kind!r}; expected one of {NATIVE_KINDS}")
