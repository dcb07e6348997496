"""What every native streaming protocol client shares: one deadline, cancellation that closes the stream,
retries, a circuit breaker. ``llamacpp_infill.py`` (llama.cpp's ``/infill``) and ``ollama.py``
(Ollama's ``/api/generate``) only say how a request is written and how its stream is read.

The rules are those of ``openai_http.py`` (its module docstring has the reasons):

- **One deadline** for the whole call: the backend's ``timeout`` from the start, or the request's own
  ``deadline`` if sooner, across attempts and waits. No answer by then raises
  :class:`~glm5_lsp.backends.base.BackendUnavailable`; text already streamed comes back as a
  ``cancelled`` completion.
- **Cancellation closes the stream**: the exchange runs on the backend's own event loop thread;
  the caller's thread polls ``should_cancel`` every ``POLL_S`` and, when it says so, cancels the
  exchange, which closes the HTTP connection (the server sees the hang-up and stops generating).
- **Retries**: 5xx answers and transport failures, with exponential backoff, before any text was
  streamed; 429 after its ``Retry-After``. Other 4xx answers raise
  :class:`~glm5_lsp.backends.base.BackendError` with the server's message.
- **A circuit breaker** (``openai_http.CircuitBreaker``): after repeated failures every call fails
  fast with ``BackendUnavailable`` until a probe gets through.
- **Stop strings** are sent to the server and cut again here: a server that ignores them, or a
  family's control token the server does not treat as a stop, cannot leak into the editor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from glm5_lsp.backends.base import BackendError, BackendUnavailable, Completion, CompletionRequest
from glm5_lsp.backends.fim import cut_at_stop
from glm5_lsp.backends.openai_http import CircuitBreaker

log = logging.getLogger(__name__)

POLL_S = 0.02  # how often a waiting call looks at should_cancel and the deadline


class Retryable(Exception):
    """An attempt that may be tried again: a 5xx or 429 answer, or an error event in the stream."""

    def __init__(self, status: int, retry_after: float | None, message: str) -> None:
        super().__init__(message)
        self.status, self.retry_after, self.message = status, retry_after, message


@dataclass(frozen=True)
class StreamEnd:
    """The end of a stream: its finish reason and token counts."""

    finish: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class StreamingHTTPBackend:
    """Base of the native protocol clients; subclasses define :meth:`request_body` and :meth:`read_stream`."""

    name = "http"
    supports_internals = False

    def __init__(
        self,
        base_url: str,
        model: str = "",
        api_key_env: str = "",
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 5.0,
        breaker_max_cooldown_s: float = 60.0,
    ) -> None:
        if not base_url:
            raise ValueError(f"the {self.name} backend needs a base URL")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.breaker = CircuitBreaker(breaker_failures, breaker_cooldown_s, breaker_max_cooldown_s)
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._thread: threading.Thread | None = None

    # ---- what a protocol defines ----------------------------------------------------------

    def request_body(self, request: CompletionRequest) -> tuple[str, dict[str, Any]]:
        """The path to POST to and the JSON body (always asking for a stream)."""
        raise NotImplementedError

    async def read_stream(self, response: httpx.Response, emit: Callable[[str], None]) -> StreamEnd:
        """Read a streamed answer: each piece of text to ``emit``, then the end. Raise
        :class:`Retryable` for an error event the server sends in the stream."""
        raise NotImplementedError

    def read_answer(self, data: Any) -> tuple[str, StreamEnd]:
        """A whole answer in one JSON body (a server that ignored ``stream``)."""
        raise NotImplementedError

    def stops(self, request: CompletionRequest) -> list[str]:
        """The stop strings sent and enforced: the request's (subclasses add their template's)."""
        return [stop for stop in request.stop if stop]

    # ---- lifecycle ------------------------------------------------------------------------

    def load(self) -> None:
        """Nothing to load: the model lives on the server (the first request reports an unreachable one)."""

    def close(self) -> None:
        with self._lock:
            loop, client, thread = self._loop, self._client, self._thread
            self._loop = self._client = self._thread = None
        if loop is None:
            return
        if client is not None:
            try:
                asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=5)
            except Exception:  # closing is best effort
                log.debug("closing the HTTP client failed", exc_info=True)
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=5)

    def _event_loop(self) -> tuple[asyncio.AbstractEventLoop, httpx.AsyncClient]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()
                    loop.close()

                thread = threading.Thread(target=serve, name=f"{self.name}-backend", daemon=True)
                thread.start()
                ready.wait()

                async def make() -> httpx.AsyncClient:
                    return httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(self.timeout))

                self._client = asyncio.run_coroutine_threadsafe(make(), loop).result()
                self._loop, self._thread = loop, thread
            assert self._client is not None
            return self._loop, self._client

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _warn_once(self, feature: str) -> None:
        with self._lock:
            if feature in self._warned:
                return
            self._warned.add(feature)
        log.warning("%s backend at %s: %s needs the in-process runtime; ignored", self.name, self.base_url, feature)

    # ---- Backend --------------------------------------------------------------------------

    def complete(self, request: CompletionRequest) -> Completion:
        if request.logits_processor is not None:
            self._warn_once("the logits processor (decoding monitor)")
        if request.use_attention_policy and request.prompt.spans:
            self._warn_once("the attention policy (prompt roles)")
        started = time.monotonic()
        deadline = started + self.timeout
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        probe, refused = self.breaker.admit()
        if refused is not None:
            raise BackendUnavailable(f"{self.base_url}: {refused}")
        path, body = self.request_body(request)
        try:
            completion = self._with_retries(path, body, request, deadline)
        finally:
            self.breaker.release(probe)
        completion.seconds = time.monotonic() - started
        return completion

    def _with_retries(self, path: str, body: dict[str, Any], request: CompletionRequest, deadline: float) -> Completion:
        attempt = 0
        while True:
            try:
                completion = self._attempt(path, body, request, deadline)
                if completion.finish_reason != "cancelled":
                    self.breaker.succeeded()
                return completion
            except BackendUnavailable:
                raise
            except BackendError:
                self.breaker.succeeded()  # a 4xx: the server is up and answering
                raise
            except Retryable as error:
                reason, wait_for = f"HTTP {error.status}: {error.message}", error.retry_after
                if error.status == 429:
                    self.breaker.succeeded()
                    opened = False
                else:
                    opened = self.breaker.failed(reason)
            except (httpx.TransportError, httpx.StreamError) as error:
                reason, wait_for = f"{type(error).__name__}: {error}".rstrip(": "), None
                opened = self.breaker.failed(reason)
            attempts = f"giving up after {attempt + 1} attempts ({reason})"
            if attempt >= self.max_retries or opened:
                raise BackendUnavailable(f"{self.base_url}: {attempts}")
            delay = wait_for if wait_for is not None else self.backoff * (2**attempt) * (1 + random.random() / 4)
            delay = min(delay, self.max_backoff)
            now = time.monotonic()
            if wait_for is not None:
                self.breaker.hold_off(now + wait_for)
            if now + delay >= deadline:
                raise BackendUnavailable(f"{self.base_url}: {attempts}; the next try ({delay:.2f}s away) "
                                         f"would end past the request's deadline")
            log.info("%s: %s; retry %d/%d in %.2fs", self.base_url, reason, attempt + 1, self.max_retries, delay)
            while time.monotonic() < now + delay:
                if request.should_cancel is not None and request.should_cancel():
                    return Completion(text="", finish_reason="cancelled")
                time.sleep(POLL_S)
            attempt += 1

    def _attempt(self, path: str, body: dict[str, Any], request: CompletionRequest, deadline: float) -> Completion:
        """One exchange, run on the event loop while this thread waits, watching cancellation and the deadline."""
        loop, client = self._event_loop()
        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        future = asyncio.run_coroutine_threadsafe(
            self._exchange(client, path, body, events, max(POLL_S, deadline - time.monotonic())), loop)
        stops = self.stops(request)
        pieces: list[str] = []
        streamed = 0  # characters handed to on_text (never past a stop string)

        def text_so_far() -> tuple[str, bool]:
            return cut_at_stop("".join(pieces), stops)

        try:
            while True:
                if request.should_cancel is not None and request.should_cancel():
                    return Completion(text=text_so_far()[0], finish_reason="cancelled")
                left = deadline - time.monotonic()
                if left <= 0:
                    if pieces:  # the server is answering; the caller's time is up
                        return Completion(text=text_so_far()[0], finish_reason="cancelled")
                    self.breaker.failed("no answer by the request's deadline")
                    raise BackendUnavailable(f"{self.base_url}: no answer by the request's deadline")
                try:
                    kind, value = events.get(timeout=min(POLL_S, left))
                except queue.Empty:
                    continue
                if kind == "text":
                    pieces.append(value)
                    text, stopped = text_so_far()
                    if request.on_text is not None and len(text) > streamed:
                        # Hold back a tail that could be the start of a stop string.
                        safe = len(text) if stopped else max(streamed, len(text) - max((len(s) for s in stops), default=1) + 1)
                        if safe > streamed:
                            request.on_text(text[streamed:safe])
                            streamed = safe
                    if stopped:  # the rest is past a stop string: end now and close the stream
                        return Completion(text=text, finish_reason="stop")
                elif kind == "error":
                    if pieces:  # never retried: the caller has seen these pieces
                        reason = f"the stream broke after {len(pieces)} pieces: {type(value).__name__}: {value}"
                        self.breaker.failed(reason)
                        raise BackendUnavailable(f"{self.base_url}: {reason}")
                    raise value
                else:  # "end"
                    end: StreamEnd = value
                    text, stopped = text_so_far()
                    if request.on_text is not None and len(text) > streamed:
                        request.on_text(text[streamed:])
                    return Completion(text=text, finish_reason="stop" if stopped else end.finish,
                                      prompt_tokens=end.prompt_tokens, completion_tokens=end.completion_tokens,
                                      cached_tokens=end.cached_tokens)
        finally:
            future.cancel()  # a call that ended early closes its connection

    async def _exchange(self, client: httpx.AsyncClient, path: str, body: dict[str, Any],
                        events: queue.SimpleQueue[tuple[str, Any]], timeout: float) -> None:
        try:
            limits = httpx.Timeout(timeout + 1.0)  # a backstop: the waiting thread cancels at the deadline
            async with client.stream("POST", path, json=body, headers=self._headers(), timeout=limits) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self.raise_for_status(response)
                content_type = response.headers.get("content-type", "")
                if content_type.startswith("application/json"):  # the whole answer at once
                    await response.aread()
                    try:
                        data = response.json()
                    except (json.JSONDecodeError, UnicodeDecodeError) as error:
                        raise BackendError(f"{self.base_url}{path}: answer is not JSON") from error
                    text, end = self.read_answer(data)
                    if text:
                        events.put(("text", text))
                    events.put(("end", end))
                    return
                end = await self.read_stream(response, lambda piece: events.put(("text", piece)))
                events.put(("end", end))
        except Exception as error:  # noqa: BLE001 - every failure goes to the waiting thread (not CancelledError)
            events.put(("error", error))

    def raise_for_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        message = error_message(response)
        if status == 429 or (status >= 500 and status != 501):  # 501: llama.cpp's "not supported"
            raise Retryable(status, retry_after(response), message)
        if status == 401:
            raise BackendError(f"401 Unauthorized from {self.base_url}: the API key in ${self.api_key_env} is missing or wrong")
        raise BackendError(f"{status} from {self.base_url}{response.request.url.path}: {message}")


async def json_lines(lines: AsyncIterator[str], sse: bool) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a stream: server-sent events (``data: {...}``, comments and ``[DONE]``
    skipped) or newline-delimited JSON."""
    async for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if sse:
            if not line.startswith("data:"):
                continue  # ":" keep-alive comments, "event:" lines
            line = line[len("data:"):].strip()
            if line == "[DONE]":
                return
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            log.warning("skipping a malformed stream line: %s", line[:200])
            continue
        if isinstance(data, dict):
            yield data


def retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def error_message(response: httpx.Response) -> str:
    """The server's own words: ``{"error": {"message": ...}}`` (llama.cpp), ``{"error": "..."}``
    (Ollama), or the body's text."""
    try:
        data = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.text[:500] or response.reason_phrase
    error = data.get("error", data) if isinstance(data, dict) else data
    message = error.get("message", error) if isinstance(error, dict) else error
    return str(message)[:500]


def as_int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0
