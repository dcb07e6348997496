"""A served GLM-5 over the OpenAI-compatible API (vLLM, SGLang, a hosted API, or ``glm5-lsp serve-model``).

``/v1/completions`` by default (fill-in-the-middle is sent as prompt text with the FIM tokens),
``/v1/chat/completions`` with ``chat=True``. Streams with server-sent events when the request has a
streaming callback or a cancellation check. The API key comes from an environment variable and is
never logged. 429 and 5xx answers (and dropped connections) are retried with exponential backoff,
honouring ``Retry-After``; other 4xx answers raise :class:`BackendError` with the server's message.

The attention policy (``Prompt.spans``) and ``logits_processor`` need the runtime's internals; this
backend ignores them and says so once in the log. The repair loop, which only needs text, still runs.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx

from glm5_lsp.backends.base import BackendError, Completion, CompletionRequest

log = logging.getLogger(__name__)

FIM_TOKENS: tuple[str, str, str] = ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>")
CHAT_SYSTEM = "You are a code completion engine. Reply with only the code, no explanation and no Markdown."
CURSOR = "<CURSOR>"
_FENCE = re.compile(r"^```[\w+-]*\n(.*?)(?:\n```\s*)?$", re.DOTALL)


class OpenAIHTTPBackend:
    """:class:`~glm5_lsp.backends.base.Backend` for an OpenAI-compatible server."""

    name = "openai"
    supports_internals = False

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "GLM5_API_KEY",
        chat: bool = False,
        timeout: float = 60.0,
        max_retries: int = 3,
        fim: bool = True,
        fim_tokens: tuple[str, str, str] = FIM_TOKENS,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
    ) -> None:
        base = base_url.rstrip("/")
        self.base_url = base.removesuffix("/v1")
        self.model = model
        self.api_key_env = api_key_env
        self.chat = chat
        self.fim = fim
        self.fim_tokens = fim_tokens
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._client = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)))
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()

    def load(self) -> None:
        """Nothing to load: the model lives on the server (the first request reports an unreachable one)."""

    def close(self) -> None:
        self._client.close()

    # ---- request bodies -------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _body(self, request: CompletionRequest, stream: bool) -> tuple[str, dict[str, Any]]:
        prompt = request.prompt
        body: dict[str, Any] = {
            "model": self.model, "max_tokens": request.max_tokens, "temperature": request.temperature,
            "top_p": request.top_p, "stream": stream,
        }
        if request.stop:
            body["stop"] = list(request.stop)
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
        if prompt.suffix and self.fim:
            start, middle_marker, end = self.fim_tokens
            body["prompt"] = f"{start}{prompt.prefix}{middle_marker}{prompt.suffix}{end}"
        else:
            body["prompt"] = prompt.prefix
        return "/v1/completions", body

    def _warn_once(self, feature: str) -> None:
        with self._warn_lock:
            if feature in self._warned:
                return
            self._warned.add(feature)
        log.warning("%s backend at %s: %s needs the in-process runtime; ignored", self.name, self.base_url, feature)

    # ---- Backend ------------------------------------------------------------------------

    def complete(self, request: CompletionRequest) -> Completion:
        if request.logits_processor is not None:
            self._warn_once("the logits processor (decoding monitor)")
        if request.use_attention_policy and request.prompt.spans:
            self._warn_once("the attention policy (prompt roles)")
        started = time.perf_counter()
        stream = request.on_text is not None or request.should_cancel is not None
        path, body = self._body(request, stream)
        if stream:
            completion = self._with_retries(lambda: self._stream(path, body, request))
        else:
            completion = self._with_retries(lambda: self._parse(self._post(path, body)))
        if self.chat:
            completion.text = strip_fences(completion.text)
        completion.seconds = time.perf_counter() - started
        return completion

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._client.post(path, json=body, headers=self._headers())
        self._raise_for_status(response)
        try:
            return response.json()
        except json.JSONDecodeError as error:
            raise BackendError(f"{self.base_url}{path}: answer is not JSON") from error

    def _parse(self, data: dict[str, Any]) -> Completion:
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] if self.chat else choice["text"]
        except (KeyError, IndexError, TypeError) as error:
            raise BackendError(f"{self.base_url}: unexpected answer shape: {str(data)[:200]}") from error
        usage = data.get("usage") or {}
        return Completion(
            text=text or "", finish_reason=_finish(choice.get("finish_reason")),
            prompt_tokens=int(usage.get("prompt_tokens") or 0), completion_tokens=int(usage.get("completion_tokens") or 0),
        )

    def _stream(self, path: str, body: dict[str, Any], request: CompletionRequest) -> Completion:
        pieces: list[str] = []
        usage: dict[str, Any] = {}
        finish = "length"
        with self._client.stream("POST", path, json=body, headers=self._headers()) as response:
            if response.status_code >= 400:
                response.read()
                self._raise_for_status(response)
            try:
                for reason in self._events(response, request, pieces, usage):
                    finish = reason
            except (httpx.TransportError, httpx.StreamError) as error:
                if not pieces:
                    raise  # nothing streamed yet: safe to retry
                raise BackendError(f"{self.base_url}: stream broke after {len(pieces)} pieces: {error}") from error
        text = "".join(pieces)
        for stop in request.stop:  # a server that ignores "stop" still cannot leak past one
            at = text.find(stop)
            if at != -1:
                text, finish = text[:at], "stop"
        return Completion(text=text, finish_reason=finish, prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          completion_tokens=int(usage.get("completion_tokens") or 0))

    def _events(self, response: httpx.Response, request: CompletionRequest, pieces: list[str],
                usage: dict[str, Any]) -> Iterator[str]:
        """Consume the stream into ``pieces`` and ``usage``; yields finish reasons as they arrive."""
        for event in _sse_events(response.iter_lines()):
            if request.should_cancel is not None and request.should_cancel():
                yield "cancelled"
                return
            if event.get("usage"):
                usage.update(event["usage"])
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
                if piece:
                    pieces.append(piece)
                    if request.on_text is not None:
                        request.on_text(piece)
                if choice.get("finish_reason"):
                    yield _finish(choice["finish_reason"])

    # ---- errors and retries ---------------------------------------------------------------

    def _raise_for_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        if status == 429 or status >= 500:
            raise _Retryable(status, _retry_after(response), _error_message(response))
        if status == 401:
            raise BackendError(
                f"401 Unauthorized from {self.base_url}: the API key in ${self.api_key_env} is missing or wrong"
            )
        raise BackendError(f"{status} from {self.base_url}{response.request.url.path}: {_error_message(response)}")

    def _with_retries(self, call: Any) -> Completion:
        attempt = 0
        while True:
            try:
                return call()
            except _Retryable as error:
                reason, wait_for = f"HTTP {error.status}: {error.message}", error.retry_after
            except (httpx.TransportError, httpx.StreamError) as error:
                reason, wait_for = f"{type(error).__name__}: {error}", None
            if attempt >= self.max_retries:
                raise BackendError(f"{self.base_url}: giving up after {attempt + 1} attempts ({reason})")
            delay = wait_for if wait_for is not None else self.backoff * (2**attempt) * (1 + random.random() / 4)
            delay = min(delay, self.max_backoff)
            log.info("%s: %s; retry %d/%d in %.2fs", self.base_url, reason, attempt + 1, self.max_retries, delay)
            time.sleep(delay)
            attempt += 1


class _Retryable(Exception):
    def __init__(self, status: int, retry_after: float | None, message: str) -> None:
        super().__init__(message)
        self.status, self.retry_after, self.message = status, retry_after, message


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:  # an HTTP date: fall back to exponential backoff
        return None


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
        error = data.get("error", data) if isinstance(data, dict) else data
        message = error.get("message", error) if isinstance(error, dict) else error
        return str(message)[:500]
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:500] or response.reason_phrase


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _sse_events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to ``[DONE]``."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[len("data:"):].strip()
        if payload == "[DONE]":
            return
        try:
            yield json.loads(payload)
        except json.JSONDecodeError:
            log.warning("skipping a malformed server-sent event: %s", payload[:200])


def strip_fences(text: str) -> str:
    """A chat model's code without the Markdown fence it may wrap it in."""
    match = _FENCE.match(text.strip())
    return match.group(1) if match else text
