"""A served GLM-5 over the OpenAI-compatible API (vLLM, SGLang, a hosted API, or ``glm5-lsp serve-model``).

``/v1/completions`` by default (fill-in-the-middle is sent as prompt text with the FIM tokens),
``/v1/chat/completions`` with ``chat=True``. Streams with server-sent events when the request has a
streaming callback or a cancellation check. The API key comes from an environment variable and is
never logged.

Time and failure, the rules an editor needs from a remote model:

- **One deadline for the whole request**: the backend's ``timeout`` from the call's start, or the
  request's own ``deadline`` if sooner, across every attempt, backoff and ``Retry-After`` wait. With
  no answer by then the call raises :class:`~glm5_lsp.backends.base.BackendUnavailable` (text
  already streamed comes back as a ``cancelled`` completion instead).
- **Cancellation while waiting**: ``should_cancel`` is polled every ``POLL_S`` while connecting,
  waiting for the answer, reading the stream and sleeping between attempts; a cancelled request
  returns at once (``finish_reason="cancelled"``) and its connection is closed. The exchange runs on
  one event loop thread per backend (``httpx.AsyncClient``), so the caller's thread only waits, and
  calls from several threads run side by side, none held up behind another.
- **Retries**: 5xx answers and transport failures are retried with exponential backoff, 429 answers
  after their ``Retry-After``; a wait that would end past the deadline is not begun (the call gives
  up at once). Other 4xx answers raise :class:`~glm5_lsp.backends.base.BackendError` with the
  server's message (the request's fault: retrying cannot help).
- **A circuit breaker**: after ``breaker_failures`` failed attempts in a row (transport errors,
  5xx, no answer by the deadline) every call fails fast with ``BackendUnavailable`` for
  ``breaker_cooldown_s`` (doubled after each failed probe, up to ``breaker_max_cooldown_s``); then
  one call goes through as a probe, and its answer closes the breaker again. A ``Retry-After``
  holds the other calls off until then the same way (a 429 without counting as a failure): a
  server that says it is busy for 5 s is not asked again by each keystroke meanwhile.

The attention policy (``Prompt.spans``) and ``logits_processor`` need the runtime's internals; this
backend ignores them and says so once in the log. The repair loop, which only needs text, still runs.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import math
import os
import queue
import random
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from glm5_lsp.backends.base import BackendError, BackendUnavailable, Completion, CompletionRequest

log = logging.getLogger(__name__)

FIM_TOKENS: tuple[str, str, str] = ("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>")
CHAT_SYSTEM = "You are a code completion engine. Reply with only the code, no explanation and no Markdown."
CURSOR = "<CURSOR>"
_FENCE = re.compile(r"^```[\w+-]*\n(.*?)(?:\n```\s*)?$", re.DOTALL)
POLL_S = 0.02  # how often a waiting call looks at should_cancel and the deadline


class CircuitBreaker:
    """Closed, open after ``failures`` consecutive failures, half-open after the cool-down.

    Thread-safe. ``admit`` says whether a call may go to the server: in the open state none may; in
    the half-open state one may (the probe) while the others fail fast. ``succeeded``/``failed``
    record an attempt's outcome; ``release`` ends a call (a probe that got no verdict, because it was
    cancelled, lets the next call probe instead).
    """

    def __init__(self, failures: int = 3, cooldown_s: float = 5.0, max_cooldown_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if failures < 1:
            raise ValueError(f"breaker_failures must be at least 1, got {failures}")
        self.failures, self.cooldown_s, self.max_cooldown_s = failures, cooldown_s, max_cooldown_s
        self.clock = clock
        self.state = "closed"
        self.consecutive = 0
        self.open_until = 0.0  # open: no call before this instant
        self.hold_until = 0.0  # a Retry-After past a deadline: no call before this instant
        self._cooldown = cooldown_s
        self._probing = False
        self._lock = threading.Lock()

    def admit(self) -> tuple[bool, str | None]:
        """``(is_probe, None)`` when the call may go ahead, ``(False, why_not)`` when it must fail fast."""
        with self._lock:
            now = self.clock()
            if now < self.hold_until:
                return False, f"the server asked to wait {self.hold_until - now:.1f}s more (Retry-After)"
            if self.state == "open":
                if now < self.open_until:
                    return False, (f"circuit open after {self.consecutive} failed attempts in a row; "
                                   f"next try in {self.open_until - now:.1f}s")
                self.state = "half_open"
            if self.state == "half_open":
                if self._probing:
                    return False, "circuit half-open: another request is probing the server"
                self._probing = True
                return True, None
            return False, None

    def release(self, probe: bool) -> None:
        if probe:
            with self._lock:
                self._probing = False

    def succeeded(self) -> None:
        with self._lock:
            reopened = self.state != "closed"
            self.state, self.consecutive, self._cooldown = "closed", 0, self.cooldown_s
        if reopened:
            log.warning("the model server answers again; circuit closed")

    def failed(self, reason: str) -> bool:
        """Count a failed attempt; True when the circuit is (now) open."""
        with self._lock:
            self.consecutive += 1
            if self.state == "half_open":  # the probe failed: open again, for longer
                self._cooldown = min(self.max_cooldown_s, self._cooldown * 2)
            elif self.state == "closed" and self.consecutive < self.failures:
                return False
            elif self.state == "open":
                return True
            self.state, self.open_until = "open", self.clock() + self._cooldown
            cooldown = self._cooldown
        log.warning("model server: %d failed attempts in a row (last: %s); failing fast for %.1fs",
                    self.consecutive, reason, cooldown)
        return True

    def hold_off(self, until: float) -> None:
        with self._lock:
            self.hold_until = max(self.hold_until, until)


class _Retryable(Exception):
    def __init__(self, status: int, retry_after: float | None, message: str) -> None:
        super().__init__(message)
        self.status, self.retry_after, self.message = status, retry_after, message


class _Stop(Exception):
    """The call ends now with this completion (cancelled) or this error."""

    def __init__(self, completion: Completion | None = None, error: BackendError | None = None) -> None:
        super().__init__()
        self.completion, self.error = completion, error


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
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 5.0,
        breaker_max_cooldown_s: float = 60.0,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        base = base_url.rstrip("/")
        self.base_url = base.removesuffix("/v1")
        self.model = model
        self.api_key_env = api_key_env
        self.chat = chat
        self.fim = fim
        self.fim_tokens = fim_tokens
        self.timeout = timeout  # the whole call, every attempt and wait included
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.breaker = CircuitBreaker(breaker_failures, breaker_cooldown_s, breaker_max_cooldown_s)
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def load(self) -> None:
        """Start the event loop and the HTTP client (a first request would otherwise pay for them: about
        0.1 s, most of it the TLS context). The model lives on the server: an unreachable one is
        reported by the first request."""
        self._event_loop()

    def close(self) -> None:
        with self._start_lock:
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
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()
                    loop.close()

                thread = threading.Thread(target=serve, name=f"http-backend-{self.base_url}", daemon=True)
                thread.start()
                ready.wait()

                async def make() -> httpx.AsyncClient:
                    return httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(self.timeout))

                self._client = asyncio.run_coroutine_threadsafe(make(), loop).result()
                self._loop, self._thread = loop, thread
            assert self._client is not None
            return self._loop, self._client

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
        started = time.monotonic()
        deadline = started + self.timeout
        if request.deadline is not None:
            deadline = min(deadline, request.deadline)
        probe, refused = self.breaker.admit()
        if refused is not None:
            raise BackendUnavailable(f"{self.base_url}: {refused}")
        stream = request.on_text is not None or request.should_cancel is not None
        path, body = self._body(request, stream)
        try:
            completion = self._with_retries(path, body, stream, request, deadline)
        finally:
            self.breaker.release(probe)
        if self.chat:
            completion.text = strip_fences(completion.text)
        completion.seconds = time.monotonic() - started
        return completion

    def _with_retries(self, path: str, body: dict[str, Any], stream: bool, request: CompletionRequest,
                      deadline: float) -> Completion:
        attempt = 0
        while True:
            try:
                completion = self._attempt(path, body, stream, request, deadline)
                self.breaker.succeeded()
                return completion
            except _Stop as stop:
                if stop.error is not None:
                    raise stop.error from None
                assert stop.completion is not None
                return stop.completion
            except BackendError:
                self.breaker.succeeded()  # a 4xx: the server is up and answering
                raise
            except _Retryable as error:
                reason, wait_for = f"HTTP {error.status}: {error.message}", error.retry_after
                if error.status >= 500:
                    opened = self.breaker.failed(reason)
                else:  # 429: the server is up, only busy
                    self.breaker.succeeded()
                    opened = False
            except (httpx.HTTPError, httpx.StreamError) as error:  # transport, decoding, redirects
                reason, wait_for = f"{type(error).__name__}: {error}".rstrip(": "), None
                opened = self.breaker.failed(reason)
            attempts = f"giving up after {attempt + 1} attempt{'s' if attempt else ''} ({reason})"
            if attempt >= self.max_retries or opened:
                raise BackendUnavailable(f"{self.base_url}: {attempts}")
            delay = wait_for if wait_for is not None else self.backoff * (2**attempt) * (1 + random.random() / 4)
            delay = min(delay, self.max_backoff)
            now = time.monotonic()
            if wait_for is not None:  # the server said when: no other call asks it again before then
                self.breaker.hold_off(now + wait_for)
            if now + delay >= deadline:
                raise BackendUnavailable(f"{self.base_url}: {attempts}; the next try ({delay:.2f}s away) "
                                         f"would end past the request's deadline")
            log.info("%s: %s; retry %d/%d in %.2fs", self.base_url, reason, attempt + 1, self.max_retries, delay)
            if not _sleep_unless_cancelled(now + delay, request.should_cancel):
                return Completion(text="", finish_reason="cancelled")
            attempt += 1

    def _attempt(self, path: str, body: dict[str, Any], stream: bool, request: CompletionRequest,
                 deadline: float) -> Completion:
        """One exchange with the server, waited for in this thread while the event loop runs it."""
        loop, client = self._event_loop()
        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        exchange = self._exchange(client, path, body, stream, events, max(POLL_S, deadline - time.monotonic()))
        future = asyncio.run_coroutine_threadsafe(exchange, loop)
        pieces: list[str] = []

        def cut_short(finish: str) -> Completion:
            return Completion(text=_cut_at_stops("".join(pieces), request.stop)[0], finish_reason=finish)

        try:
            while True:
                if request.should_cancel is not None and request.should_cancel():
                    raise _Stop(cut_short("cancelled"))
                left = deadline - time.monotonic()
                if left <= 0:
                    if pieces:  # the server is answering; the caller's time is up
                        raise _Stop(cut_short("cancelled"))
                    reason = "no answer by the request's deadline"
                    self.breaker.failed(reason)
                    raise _Stop(error=BackendUnavailable(f"{self.base_url}: {reason}"))
                try:
                    kind, value = events.get(timeout=min(POLL_S, left))
                except queue.Empty:
                    continue
                if kind == "text":
                    pieces.append(value)
                    if request.on_text is not None:
                        request.on_text(value)
                elif kind == "error":
                    if pieces:  # never retried: the caller has seen these pieces
                        reason = f"the stream broke after {len(pieces)} pieces: {type(value).__name__}: {value}"
                        self.breaker.failed(reason)
                        raise _Stop(error=BackendUnavailable(f"{self.base_url}: {reason}"))
                    raise value
                elif kind == "answer":
                    return value
                else:  # "end" of a stream: its finish reason and usage
                    finish, usage = value
                    text, stopped = _cut_at_stops("".join(pieces), request.stop)
                    return Completion(text=text, finish_reason="stop" if stopped else finish,
                                      prompt_tokens=int(usage.get("prompt_tokens") or 0),
                                      completion_tokens=int(usage.get("completion_tokens") or 0))
        finally:
            future.cancel()  # a call that ended early closes its connection

    async def _exchange(self, client: httpx.AsyncClient, path: str, body: dict[str, Any], stream: bool,
                        events: queue.SimpleQueue[tuple[str, Any]], timeout: float) -> None:
        """Run on the event loop: the request, its answer or stream posted to ``events``."""
        try:
            limits = httpx.Timeout(timeout + 1.0)  # a backstop: the waiting thread cancels at the deadline
            if not stream:
                response = await client.post(path, json=body, headers=self._headers(), timeout=limits)
                self._raise_for_status(response)
                try:
                    data = response.json()
                except (json.JSONDecodeError, UnicodeDecodeError) as error:
                    raise BackendError(f"{self.base_url}{path}: answer is not JSON") from error
                events.put(("answer", self._parse(data)))
                return
            async with client.stream("POST", path, json=body, headers=self._headers(), timeout=limits) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self._raise_for_status(response)
                if response.headers.get("content-type", "").startswith("application/json"):
                    await response.aread()  # a server that ignores "stream": the whole answer at once
                    try:
                        data = response.json()
                    except (json.JSONDecodeError, UnicodeDecodeError) as error:
                        raise BackendError(f"{self.base_url}{path}: answer is not JSON") from error
                    answer = self._parse(data)
                    if answer.text:
                        events.put(("text", answer.text))
                    events.put(("end", (answer.finish_reason, data.get("usage") or {})))
                    return
                usage: dict[str, Any] = {}
                finish = "length"
                async for event in _sse_events_async(response.aiter_lines()):
                    if event.get("error"):
                        raise _Retryable(500, None, str(event["error"])[:500])
                    if event.get("usage"):
                        usage.update(event["usage"])
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
                        if piece:
                            events.put(("text", piece))
                        if choice.get("finish_reason"):
                            finish = _finish(choice["finish_reason"])
                events.put(("end", (finish, usage)))
        except Exception as error:  # noqa: BLE001 - every failure goes to the waiting thread (not CancelledError)
            events.put(("error", error))

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

    # ---- errors ---------------------------------------------------------------------------

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


def _sleep_unless_cancelled(until: float, should_cancel: Callable[[], bool] | None) -> bool:
    """Sleep until ``until``; False (at once) if ``should_cancel`` says so first."""
    while True:
        if should_cancel is not None and should_cancel():
            return False
        left = until - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(POLL_S, left))


def _cut_at_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    """A server that ignores ``stop`` still cannot leak past one."""
    cut = min((at for at in (text.find(stop) for stop in stops) if at != -1), default=-1)
    return (text[:cut], True) if cut != -1 else (text, False)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:  # an HTTP date
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


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


def _sse_payload(line: str) -> dict[str, Any] | None | bool:
    """One line of a server-sent event stream: its JSON payload, None to skip it, False at ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:"):].strip()
    if payload == "[DONE]":
        return False
    try:
        data = json.loads(payload)
    except json.JSONDecodeError:
        log.warning("skipping a malformed server-sent event: %s", payload[:200])
        return None
    return data if isinstance(data, dict) else None


async def _sse_events_async(lines: Any) -> Any:
    """The JSON payloads of a server-sent event stream, up to ``[DONE]``."""
    async for line in lines:
        data = _sse_payload(line)
        if data is False:
            return
        if data:
            yield data


def strip_fences(text: str) -> str:
    """A chat model's code without the Markdown fence it may wrap it in."""
    match = _FENCE.match(text.strip())
    return match.group(1) if match else text
