"""Ollama's ``/api/generate``: fill-in-the-middle with ``suffix``, or a whole prompt in ``raw`` mode.

Two ways to infill, chosen by whether a template is given:

- **suffix** (no template): ``{"prompt": prefix, "suffix": suffix}``; Ollama lays the two out with
  the model's own template (its ``{{ .Suffix }}``), so any model whose Ollama template supports
  insertion works, and one that does not answers 400 "... does not support insert".
- **raw** (a :class:`~glm5_lsp.backends.fim.FimTemplate`): the prompt is rendered here and sent with
  ``"raw": true``, which bypasses Ollama's templating. This is what lets other files' snippets go in
  the family's repository format (Ollama's templates only have a prefix and a suffix).

The answer streams as newline-delimited JSON::

    {"model":"qwen2.5-coder:1.5b","created_at":"...","response":"ret","done":false}
    {"model":"...","created_at":"...","response":"","done":true,"done_reason":"stop",
     "total_duration":..,"prompt_eval_count":26,"eval_count":9,"eval_duration":..}

(``done_reason`` is ``stop`` or ``length``; an error is ``{"error": "..."}``, mid-stream or as the
body of a 4xx/5xx answer, e.g. 404 ``model 'x' not found``). Source: ollama ``docs/api.md``
("Generate a completion", "Request (with suffix)", "Request (Raw Mode)").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

import httpx

from glm5_lsp.backends.base import BackendError, CompletionRequest
from glm5_lsp.backends.fim import FimInput, FimTemplate
from glm5_lsp.backends.http_stream import (
    Retryable,
    StreamEnd,
    StreamingHTTPBackend,
    as_int,
    error_message,
    json_lines,
)

log = logging.getLogger(__name__)


class OllamaBackend(StreamingHTTPBackend):
    """:class:`~glm5_lsp.backends.base.Backend` for an Ollama server (``http://127.0.0.1:11434``)."""

    name = "ollama"

    def __init__(self, base_url: str = "http://127.0.0.1:11434", model: str = "", template: FimTemplate | None = None,
                 keep_alive: str | None = None, num_ctx: int | None = None, api_key_env: str = "", **options: Any) -> None:
        if not model:
            raise ValueError("the ollama backend needs a model name (e.g. qwen2.5-coder:1.5b-base)")
        super().__init__(base_url.removesuffix("/api").removesuffix("/v1"), model=model, api_key_env=api_key_env, **options)
        self.template = template
        self.keep_alive = keep_alive
        self.num_ctx = num_ctx

    def load(self) -> None:
        """Start the client and have Ollama load the model into memory: ``/api/generate`` with no
        prompt loads it and generates nothing (ollama ``docs/api.md``, "Load a model"). A cold model
        takes seconds to load, longer than an as-you-type budget, so without this the first
        completions would all come back empty. A model the server does not have is a
        :class:`BackendError` now (``ollama pull NAME``); a server that does not answer in ``timeout``
        is only logged (it may come up later: the requests report it then)."""
        super().load()
        loop, client = self._event_loop()
        body: dict[str, Any] = {"model": self.model, "stream": False}
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive

        async def preload() -> httpx.Response:
            return await client.post("/api/generate", json=body, headers=self._headers(), timeout=self.timeout)

        try:
            response = asyncio.run_coroutine_threadsafe(preload(), loop).result(timeout=self.timeout + 1)
        except (httpx.HTTPError, concurrent.futures.TimeoutError, OSError) as error:
            log.warning("ollama at %s: could not load %s ahead of the first request (%s: %s)", self.base_url,
                        self.model, type(error).__name__, error)
            return
        if response.status_code == 404:
            raise BackendError(f"Ollama at {self.base_url} has no model {self.model!r} ({error_message(response)}); "
                               f"pull it with: ollama pull {self.model}")
        if response.status_code >= 400:
            log.warning("ollama at %s: loading %s answered %d: %s", self.base_url, self.model, response.status_code,
                        error_message(response))
            return
        log.info("ollama at %s: %s is loaded", self.base_url, self.model)

    def stops(self, request: CompletionRequest) -> list[str]:
        stops = super().stops(request)
        if self.template is not None and request.prompt.suffix:
            stops += [s for s in self.template.stop if s not in stops]
        return stops

    def request_body(self, request: CompletionRequest) -> tuple[str, dict[str, Any]]:
        fim = FimInput.from_prompt(request.prompt)
        options: dict[str, Any] = {"num_predict": request.max_tokens, "temperature": request.temperature,
                                   "top_p": request.top_p}
        if request.seed is not None:
            options["seed"] = request.seed
        if self.num_ctx is not None:
            options["num_ctx"] = self.num_ctx
        stops = self.stops(request)
        if stops:
            options["stop"] = stops
        body: dict[str, Any] = {"model": self.model, "stream": True, "options": options}
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        if not fim.suffix and not fim.files:
            body.update(prompt=fim.prefix, raw=True)  # plain continuation: the model's chat template would get in the way
        elif self.template is not None:
            body.update(prompt=self.template(fim), raw=True)
        else:
            body.update(prompt=fim.prefix, suffix=fim.suffix)
        return "/api/generate", body

    async def read_stream(self, response: httpx.Response, emit: Callable[[str], None]) -> StreamEnd:
        async for event in json_lines(response.aiter_lines(), sse=False):
            if event.get("error"):
                raise Retryable(500, None, str(event["error"])[:500])
            if event.get("response"):
                emit(str(event["response"]))
            if event.get("done"):
                return _end(event)
        return StreamEnd("length")  # the server hung up without a final line

    def read_answer(self, data: Any) -> tuple[str, StreamEnd]:
        if not isinstance(data, dict) or "response" not in data:
            raise BackendError(f"{self.base_url}: unexpected answer shape: {str(data)[:200]}")
        return str(data.get("response") or ""), _end(data)


def _end(event: dict[str, Any]) -> StreamEnd:
    return StreamEnd("length" if event.get("done_reason") == "length" else "stop",
                     prompt_tokens=as_int(event.get("prompt_eval_count")),
                     completion_tokens=as_int(event.get("eval_count")))
