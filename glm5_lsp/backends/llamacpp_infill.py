"""llama.cpp's native ``/infill``: the server builds the infilling prompt from the model's own tokens.

``llama-server -m model.gguf`` (llama.cpp's HTTP server) answers ``POST /infill`` with
``input_prefix``, ``input_suffix`` and ``input_extra`` (other files' chunks, ``[{"filename",
"text"}]``). It reads the model's FIM tokens from the GGUF (``tokenizer.ggml.fim_pre_token_id`` and
friends) and lays the chunks out in the repository format where the model has one
(``<|repo_name|>``/``<|file_sep|>`` for Qwen2.5-Coder), so no template is needed here: one client
serves every family llama.cpp knows. ``cache_prompt`` keeps the previous request's KV cache for the
shared prefix, which is most of an as-you-type request.

The answer streams as server-sent events, one JSON object per piece::

    data: {"index":0,"content":"ret","tokens":[],"stop":false,"id_slot":0,"tokens_predicted":1,...}
    data: {"index":0,"content":"","stop":true,"stop_type":"eos","tokens_predicted":9,
           "tokens_evaluated":31,"tokens_cached":30,"timings":{...},...}

(no ``[DONE]`` line; ``stop_type`` is ``eos``, ``word``, ``limit`` or ``none``; an error in the
stream is ``data: {"error": {"code":..,"message":..,"type":..}}``). Errors before the stream are
JSON with that ``error`` object and its HTTP status (501 for a model without FIM tokens).
Source: ``tools/server/server-context.cpp`` (``post_infill``) and ``server-task.cpp``
(``to_json_non_oaicompat``) in llama.cpp.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httpx

from glm5_lsp.backends.base import BackendError, CompletionRequest
from glm5_lsp.backends.fim import FimInput
from glm5_lsp.backends.http_stream import Retryable, StreamEnd, StreamingHTTPBackend, as_int, json_lines

_FINISH = {"limit": "length", "eos": "stop", "word": "stop"}


class LlamaCppInfillBackend(StreamingHTTPBackend):
    """:class:`~glm5_lsp.backends.base.Backend` for llama.cpp's ``/infill`` (fill-in-the-middle) and, for a
    request without a suffix, its native ``/completion`` (left-to-right)."""

    name = "llamacpp"

    def __init__(self, base_url: str, model: str = "", api_key_env: str = "", cache_prompt: bool = True,
                 extra_stop: Sequence[str] = (), **options: Any) -> None:
        super().__init__(base_url.removesuffix("/v1"), model=model, api_key_env=api_key_env, **options)
        self.cache_prompt = cache_prompt
        self.extra_stop = tuple(extra_stop)

    def stops(self, request: CompletionRequest) -> list[str]:
        return [*super().stops(request), *(s for s in self.extra_stop if s not in request.stop)]

    def request_body(self, request: CompletionRequest) -> tuple[str, dict[str, Any]]:
        fim = FimInput.from_prompt(request.prompt)
        body: dict[str, Any] = {
            "n_predict": request.max_tokens, "temperature": request.temperature, "top_p": request.top_p,
            "stream": True, "cache_prompt": self.cache_prompt,
        }
        stops = self.stops(request)
        if stops:
            body["stop"] = stops
        if request.seed is not None:
            body["seed"] = request.seed
        if not (fim.suffix or fim.files):
            body["prompt"] = fim.prefix
            return "/completion", body
        body.update(input_prefix=fim.prefix, input_suffix=fim.suffix,
                    input_extra=[{"filename": chunk.path, "text": chunk.text} for chunk in fim.files])
        return "/infill", body

    async def read_stream(self, response: httpx.Response, emit: Callable[[str], None]) -> StreamEnd:
        async for event in json_lines(response.aiter_lines(), sse=True):
            if event.get("error"):
                error = event["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                raise Retryable(500, None, str(message)[:500])
            if event.get("content"):
                emit(str(event["content"]))
            if event.get("stop"):
                return _end(event)
        return StreamEnd("length")  # the server hung up without a final event

    def read_answer(self, data: Any) -> tuple[str, StreamEnd]:
        if not isinstance(data, dict) or "content" not in data:
            raise BackendError(f"{self.base_url}: unexpected answer shape: {str(data)[:200]}")
        return str(data.get("content") or ""), _end(data)


def _end(event: dict[str, Any]) -> StreamEnd:
    return StreamEnd(_FINISH.get(str(event.get("stop_type")), "stop"),
                     prompt_tokens=as_int(event.get("tokens_evaluated")),
                     completion_tokens=as_int(event.get("tokens_predicted")),
                     cached_tokens=as_int(event.get("tokens_cached")))
