"""A served model over the OpenAI-compatible API (vLLM, SGLang, llama.cpp's server, LM Studio, a hosted
API, or ``glm5-lsp serve-model``).

``/v1/completions`` by default, ``/v1/chat/completions`` with ``chat=True``. Streams with server-sent
events when the request has a streaming callback or a cancellation check. The API key comes from an
environment variable and is never logged. Time, retries, cancellation and the circuit breaker are
``http_stream.py``'s (one loop for every HTTP backend; its docstring has the rules).

**Fill-in-the-middle on ``/v1/completions``** is prompt text in the served model's own layout
(``backends/fim.py``), chosen by ``fim``:

- ``auto`` (the default): the family the model's name says (``Qwen/Qwen2.5-Coder-7B``,
  ``deepseek-coder-6.7b-base``, ...), else ``glm`` (this project's checkpoints, ``serve-model``);
- a family name (``qwen2.5-coder``, ``starcoder2``, ...) forces that layout;
- ``custom``: ``fim_template`` with ``{prefix}``/``{suffix}`` and its ``fim_stop`` strings;
- ``server``: the prompt and the OpenAI ``suffix`` field, for a server that lays infilling out itself
  (``serve-model`` does; vLLM and SGLang refuse ``suffix``);
- ``False``: no infilling, the prefix alone.

A template's stop strings (its end-of-text and control tokens) are sent with the request's own and
enforced on the answer. A prompt that carries other files' snippets (``Prompt.files``) uses the
family's repository-level form where it has one. Chat mode stays chat: a plain instruction, with the
Markdown fence a chat model may add stripped from the answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from glm5_lsp.backends.base import BackendError, Completion, CompletionRequest
from glm5_lsp.backends.fim import FimInput, FimTemplate, template_for
from glm5_lsp.backends.http_stream import (
    POLL_S,
    CircuitBreaker,
    Retryable,
    StreamEnd,
    StreamingHTTPBackend,
    as_int,
    json_lines,
)

__all__ = ["CHAT_SYSTEM", "CURSOR", "POLL_S", "CircuitBreaker", "OpenAIHTTPBackend", "openai_template", "strip_fences"]

CHAT_SYSTEM = "You are a code completion engine. Reply with only the code, no explanation and no Markdown."
CURSOR = "<CURSOR>"
_FENCE = re.compile(r"^```[\w+-]*\n(.*?)(?:\n```\s*)?$", re.DOTALL)


def openai_template(fim: str | bool, model: str, fim_template: str = "", fim_stop: Sequence[str] = ()) -> FimTemplate | None:
    """The template ``/v1/completions`` renders infilling with, or None (``server``: the ``suffix``
    field; ``False``: the prefix alone). ``ValueError`` for an unknown family or a bad custom template."""
    if fim is False:
        return None
    mode = "auto" if fim is True else (fim or "auto").strip().lower()
    if mode == "server":
        return None
    return template_for(mode, model, fim_template, fim_stop)


class OpenAIHTTPBackend(StreamingHTTPBackend):
    """:class:`~glm5_lsp.backends.base.Backend` for an OpenAI-compatible server."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "GLM5_API_KEY",
        chat: bool = False,
        timeout: float = 60.0,
        max_retries: int = 3,
        fim: str | bool = "auto",
        fim_template: str = "",
        fim_stop: Sequence[str] = (),
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 5.0,
        breaker_max_cooldown_s: float = 60.0,
    ) -> None:
        super().__init__(base_url.rstrip("/").removesuffix("/v1"), model=model, api_key_env=api_key_env,
                         timeout=timeout, max_retries=max_retries, backoff=backoff, max_backoff=max_backoff,
                         breaker_failures=breaker_failures, breaker_cooldown_s=breaker_cooldown_s,
                         breaker_max_cooldown_s=breaker_max_cooldown_s)
        self.chat = chat
        self.fim: str | bool = fim if isinstance(fim, bool) else (fim or "auto").strip().lower()
        self.template = openai_template(fim, model, fim_template, fim_stop)

    # ---- request bodies -------------------------------------------------------------------

    def _infills(self, request: CompletionRequest) -> FimInput | None:
        """The infilling input when this request is sent as a template's prompt text, else None."""
        if self.chat or self.template is None:
            return None
        fim = FimInput.from_prompt(request.prompt)
        return fim if fim.suffix or fim.files else None

    def stops(self, request: CompletionRequest) -> list[str]:
        stops = super().stops(request)
        if self._infills(request) is not None:
            assert self.template is not None
            stops += [stop for stop in self.template.stop if stop not in stops]
        return stops

    def request_body(self, request: CompletionRequest) -> tuple[str, dict[str, Any]]:
        prompt = request.prompt
        stream = request.on_text is not None or request.should_cancel is not None
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": request.max_tokens, "temperature": request.temperature,
            "top_p": request.top_p, "stream": stream,
        }
        stops = self.stops(request)
        if stops:
            body["stop"] = stops
        if request.seed is not None:
            body["seed"] = request.seed
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.chat:
            if prompt.suffix:
                content = ("Write the code that replaces " + CURSOR + " in this file.\n\n"
                           + prompt.prefix + CURSOR + prompt.suffix)
            else:
                content = "Continue this code from where it ends.\n\n" + prompt.prefix
            body["messages"] = [{"role": "system", "content": CHAT_SYSTEM}, {"role": "user", "content": content}]
            return "/v1/chat/completions", body
        fim = self._infills(request)
        if fim is not None:
            assert self.template is not None
            body["prompt"] = self.template(fim)
        else:
            body["prompt"] = prompt.prefix
            if prompt.suffix and self.fim == "server":
                body["suffix"] = prompt.suffix
        return "/v1/completions", body

    # ---- answers --------------------------------------------------------------------------

    async def read_stream(self, response: httpx.Response, emit: Callable[[str], None]) -> StreamEnd:
        usage: dict[str, Any] = {}
        finish = "length"
        async for event in json_lines(response.aiter_lines(), sse=True):
            if event.get("error"):
                error = event["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                raise Retryable(500, None, str(message)[:500])
            if isinstance(event.get("usage"), dict):
                usage.update(event["usage"])
            for choice in event.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                piece = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
                if piece:
                    emit(str(piece))
                if choice.get("finish_reason"):
                    finish = _finish(choice["finish_reason"])
        return _end(finish, usage)

    def read_answer(self, data: Any) -> tuple[str, StreamEnd]:
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.chat else choice["text"]
        except (KeyError, IndexError, TypeError) as error:
            raise BackendError(f"{self.base_url}: unexpected answer shape: {str(data)[:200]}") from error
        return str(text or ""), _end(_finish(choice.get("finish_reason")), data.get("usage") or {})

    def complete(self, request: CompletionRequest) -> Completion:
        completion = super().complete(request)
        if self.chat:
            completion.text = strip_fences(completion.text)
        return completion


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _end(finish: str, usage: Any) -> StreamEnd:
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return StreamEnd(finish, prompt_tokens=as_int(usage.get("prompt_tokens")),
                     completion_tokens=as_int(usage.get("completion_tokens")), cached_tokens=as_int(cached))


def strip_fences(text: str) -> str:
    """A chat model's code without the Markdown fence it may wrap it in."""
    match = _FENCE.match(text.strip())
    return match.group(1) if match else text
