"""The one wait/retry/stream loop every HTTP backend runs: OpenAI's ``/v1/completions`` and
``/v1/chat/completions`` (``openai_http.py``), llama.cpp's ``/infill`` (``llamacpp_infill.py``) and
Ollama's ``/api/generate`` (``ollama.py``). A protocol only says how a request is written
(:meth:`StreamingHTTPBackend.request_body`) and how its answer is read (:meth:`~StreamingHTTPBackend.read_stream`
for a stream, :meth:`~StreamingHTTPBackend.read_answer` for one JSON body).

Time and failure, the rules an editor needs from a remote model:

- **One deadline for the whole request**: the backend's ``timeout`` from the call's start, or the
  request's own ``deadline`` if sooner, across every attempt, backoff and ``Retry-After`` wait.
  Nothing by the backend's own ``timeout`` raises
  :class:`~glm5_lsp.backends.base.BackendUnavailable` (naming the URL; a breaker failure). When the
  *request's* (shorter) deadline runs out first, text streamed so far comes back as a ``cancelled``
  completion: the server may only be slower than the caller's budget.
- **Down, or only slow?** One request cannot tell a server that hangs from one still loading the
  model or busy with another request (Ollama and a queued llama.cpp send no headers until the first
  token). So a request the server has sent nothing for ``PROBE_AFTER_S`` starts a liveness probe
  (``GET /`` on another connection; any HTTP answer, even a 404, means the process is up). A
  server that answers nothing at all, not even that, in ``PROBE_TIMEOUT_S`` is down: the circuit
  opens at once and the requests waiting on it raise ``BackendUnavailable`` ("... nor to a liveness
  probe"), so the editor can say so once. A server that answers the probe is slow: its requests are
  cut at their deadline as ``cancelled`` and count nothing against it (a fix with a longer budget
  still gets its answer). ``should_cancel`` reporting the request's deadline (the repair loop
  folds the same instant into it) is the deadline, not the caller changing its mind.
- **Cancellation closes the stream**: the exchange runs on one event loop thread per backend
  (``httpx.AsyncClient``), so the caller's thread only waits, and calls from several threads run
  side by side, none held up behind another. The waiting thread polls ``should_cancel`` every
  ``POLL_S`` while connecting, waiting for the answer, reading the stream and sleeping between
  attempts; a cancelled request returns at once (``finish_reason="cancelled"``) and its exchange is
  cancelled, which closes the connection (the server sees the hang-up and stops generating).
- **Retries**: 5xx answers (but 501, "not supported": llama.cpp's answer for a model without
  infilling tokens) and every ``httpx`` failure (transport, decoding, redirects) are retried with
  exponential backoff, 429 answers after their ``Retry-After`` (seconds or an HTTP date); a wait
  that would end past the deadline is not begun (the call gives up at once). Nothing is retried once
  text was streamed (the caller has seen it): a stream that breaks then is ``BackendUnavailable``.
  Other 4xx answers raise :class:`~glm5_lsp.backends.base.BackendError` with the server's message
  (the request's fault: retrying cannot help).
- **A circuit breaker** (:class:`CircuitBreaker`): after ``breaker_failures`` failed attempts in a
  row (transport errors, 5xx, no answer by the backend's ``timeout``), or at once when the liveness
  probe finds the server down, every call fails fast with ``BackendUnavailable`` for
  ``breaker_cooldown_s`` (doubled after each failed probe, up to ``breaker_max_cooldown_s``); then
  one call goes through as a probe, and its answer closes the breaker again. A ``Retry-After``
  holds the other calls off until then the same way (a 429 without counting as a failure): a
  server that says it is busy for 5 s is not asked again by each keystroke meanwhile.
- **Stop strings** are sent to the server and cut again here (:meth:`StreamingHTTPBackend.stops`): a
  server that ignores them, or a family's control token the server does not treat as a stop, cannot
  leak into the editor. Streamed text holds back only a tail that could begin a stop string, and a
  stop string seen in the stream ends the call and closes the stream at once.

The attention policy (``Prompt.spans``) and ``logits_processor`` need the runtime's internals; these
backends ignore them and say so once in the log. The repair loop, which only needs text, still runs.
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
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from glm5_lsp.backends.base import BackendError, BackendUnavailable, Completion, CompletionRequest
from glm5_lsp.backends.fim import cut_at_stop

log = logging.getLogger(__name__)

POLL_S = 0.02  # how often a waiting call looks at should_cancel and the deadline
PROBE_AFTER_S = 0.1  # a request the server has sent nothing for this long has the server probed
PROBE_TIMEOUT_S = 1.0  # a server that answers no HTTP request at all in this long is down


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
        self.last_failure = ""  # why the last attempt failed (said when calls are refused)
        self._lock = threading.Lock()

    def admit(self) -> tuple[bool, str | None]:
        """``(is_probe, None)`` when the call may go ahead, ``(False, why_not)`` when it must fail fast."""
        with self._lock:
            now = self.clock()
            if now < self.hold_until:
                return False, f"the server asked to wait {self.hold_until - now:.1f}s more (Retry-After)"
            if self.state == "open":
                if now < self.open_until:
                    return False, (f"circuit open after {self.consecutive} failed attempts in a row (last: "
                                   f"{self.last_failure}); next try in {self.open_until - now:.1f}s")
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
            self.last_failure = reason
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

    def trip(self, reason: str) -> None:
        """Open now, whatever the count: the server was seen to be down (it answers nothing at all)."""
        with self._lock:
            if self.state == "open" and self.clock() < self.open_until:
                return
            if self.state == "half_open":
                self._cooldown = min(self.max_cooldown_s, self._cooldown * 2)
            self.last_failure = reason
            self.consecutive = max(self.consecutive + 1, self.failures)
            self.state, self.open_until = "open", self.clock() + self._cooldown
            cooldown = self._cooldown
        log.warning("model server: %s; failing fast for %.1fs", reason, cooldown)


class Retryable(Exception):
    """An attempt that may be tried again: a 5xx or 429 answer, or an error event in the stream."""

    def __init__(self, status: int, retry_after: float | None, message: str) -> None:
        super().__init__(message)
        self.status, self.retry_after, self.message = status, retry_after, message


@dataclass(frozen=True)
class Liveness:
    """A liveness probe's verdict: when it ended, whether the server answered, and if not, why."""

    finished: float  # time.monotonic()
    alive: bool
    why: str = ""


@dataclass(frozen=True)
class StreamEnd:
    """The end of a stream: its finish reason and token counts."""

    finish: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class StreamingHTTPBackend:
    """Base of the HTTP protocol clients; subclasses define :meth:`request_body`, :meth:`read_stream`
    and :meth:`read_answer` (and :meth:`stops` where a template adds its own)."""

    name = "http"
    supports_internals = False
    not_retried: frozenset[int] = frozenset({501})  # 5xx statuses that mean "never", not "not now"

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
        if max_retries < 0:
            raise ValueError(f"max_retries must be at least 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = timeout  # the whole call, every attempt and wait included
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.breaker = CircuitBreaker(breaker_failures, breaker_cooldown_s, breaker_max_cooldown_s)
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self.heard_at = -math.inf  # when the server last sent anything (headers of any answer, a probe's)
        self.liveness: Liveness | None = None  # the last probe's verdict
        self._probing: Any = None  # the running probe (a concurrent.futures.Future)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._thread: threading.Thread | None = None

    # ---- what a protocol defines ----------------------------------------------------------

    def request_body(self, request: CompletionRequest) -> tuple[str, dict[str, Any]]:
        """The path to POST to and the JSON body."""
        raise NotImplementedError

    async def read_stream(self, response: httpx.Response, emit: Callable[[str], None]) -> StreamEnd:
        """Read a streamed answer: each piece of text to ``emit``, then the end. Raise
        :class:`Retryable` for an error event the server sends in the stream."""
        raise NotImplementedError

    def read_answer(self, data: Any) -> tuple[str, StreamEnd]:
        """A whole answer in one JSON body (a request that did not stream, or a server that ignored ``stream``)."""
        raise NotImplementedError

    def stops(self, request: CompletionRequest) -> list[str]:
        """The stop strings sent and enforced: the request's (subclasses add their template's)."""
        return [stop for stop in request.stop if stop]

    # ---- lifecycle ------------------------------------------------------------------------

    def load(self) -> None:
        """Start the event loop and the HTTP client (a first request would otherwise pay for them: about
        0.1 s, most of it the TLS context). The model lives on the server: an unreachable one is
        reported by the first request."""
        self._event_loop()

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

                thread = threading.Thread(target=serve, name=f"{self.name}-backend-{self.base_url}", daemon=True)
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

    # ---- down, or only slow -----------------------------------------------------------------

    def _probe_if_silent(self, since: float) -> None:
        """Start a liveness probe, unless one is running or the server has answered anything since ``since``."""
        with self._lock:
            loop, client = self._loop, self._client
            if (loop is None or client is None or self.heard_at >= since
                    or (self._probing is not None and not self._probing.done())):
                return
            self._probing = asyncio.run_coroutine_threadsafe(self._probe(client), loop)

    async def _probe(self, client: httpx.AsyncClient) -> None:
        """``GET /`` on the event loop: any HTTP answer means the server is up; none in
        ``PROBE_TIMEOUT_S`` (no connection, or no answer on it) means it is down, and the circuit
        opens. A connection refused or reset gives no verdict: the request meets the same error
        itself, and its retries and the breaker's count deal with it."""
        try:
            await client.get("/", timeout=PROBE_TIMEOUT_S)
        except httpx.TimeoutException:
            verdict = Liveness(time.monotonic(), False, f"nor to a liveness probe (GET /) in {PROBE_TIMEOUT_S:g}s")
        except httpx.HTTPError:
            return
        else:
            self.heard_at = time.monotonic()
            verdict = Liveness(self.heard_at, True)
        self.liveness = verdict
        if not verdict.alive:
            self.breaker.trip(f"{self.base_url} answers no request, {verdict.why}")

    def _seen_down(self, since: float) -> Liveness | None:
        """The probe's verdict that the server is down, if it came after ``since``."""
        verdict = self.liveness
        return verdict if verdict is not None and not verdict.alive and verdict.finished >= since else None

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
                if error.status == 429:  # the server is up, only busy
                    self.breaker.succeeded()
                    opened = False
                else:
                    opened = self.breaker.failed(reason)
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
            if not sleep_unless_cancelled(now + delay, request.should_cancel):
                return Completion(text="", finish_reason="cancelled")
            attempt += 1

    def _attempt(self, path: str, body: dict[str, Any], request: CompletionRequest, deadline: float) -> Completion:
        """One exchange, run on the event loop while this thread waits, watching cancellation and the deadline."""
        begun = time.monotonic()
        loop, client = self._event_loop()
        events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        future = asyncio.run_coroutine_threadsafe(
            self._exchange(client, path, body, events, max(POLL_S, deadline - time.monotonic())), loop)
        stops = self.stops(request)
        pieces: list[str] = []
        streamed = 0  # characters handed to on_text (never past a stop string)
        heard = False  # the server sent its status line and headers
        waited = False  # this attempt has waited on the server at least once
        callers = request.deadline is not None and deadline == request.deadline  # the caller's budget, not our timeout

        def text_so_far() -> tuple[str, bool]:
            return cut_at_stop("".join(pieces), stops)

        def silent(down: Liveness) -> BackendUnavailable:
            return BackendUnavailable(f"{self.base_url}: no answer to this request in "
                                      f"{time.monotonic() - begun:.2f}s, {down.why}")

        def out_of_time() -> Completion:
            """The deadline passed (or ``should_cancel`` said so at it: the repair loop folds the same
            deadline into it). The caller's budget running out is ``cancelled`` (with the text so
            far) unless the liveness probe found the server down; the backend's whole ``timeout``
            with no text is an outage."""
            if not heard and not pieces:
                down = self._seen_down(begun)
                if down is not None:
                    raise silent(down)
            if pieces or callers:
                if not heard and not pieces and self.liveness is not None and self.liveness.alive:
                    self._note_slow(deadline - begun)
                return Completion(text=text_so_far()[0], finish_reason="cancelled")
            reason = f"{'no text' if heard else 'no answer'} in {time.monotonic() - begun:.2f}s, by the backend's deadline"
            self.breaker.failed(reason)
            raise BackendUnavailable(f"{self.base_url}: {reason}")

        try:
            while True:
                if request.should_cancel is not None and request.should_cancel():
                    if waited and time.monotonic() >= deadline - POLL_S:
                        return out_of_time()  # the caller's deadline, not the caller changing its mind
                    return Completion(text=text_so_far()[0], finish_reason="cancelled")
                now = time.monotonic()
                left = deadline - now
                if left <= 0:
                    return out_of_time()
                if not heard and not pieces:
                    down = self._seen_down(begun)
                    if down is not None:  # the circuit is open now: nothing more to wait for
                        raise silent(down)
                    if now - begun >= PROBE_AFTER_S:
                        self._probe_if_silent(begun)
                try:
                    waited = True
                    kind, value = events.get(timeout=min(POLL_S, left))
                except queue.Empty:
                    continue
                if kind == "heard":
                    heard = True
                elif kind == "text":
                    pieces.append(value)
                    text, stopped = text_so_far()
                    if request.on_text is not None:
                        safe = len(text) if stopped else len(text) - held_back(text, stops)
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
        """Run on the event loop: the request, its answer or stream posted to ``events``."""
        try:
            limits = httpx.Timeout(timeout + 1.0)  # a backstop: the waiting thread cancels at the deadline
            async with client.stream("POST", path, json=body, headers=self._headers(), timeout=limits) as response:
                self.heard_at = time.monotonic()
                events.put(("heard", response.status_code))
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

    def _note_slow(self, budget: float) -> None:
        with self._lock:
            if "slow" in self._warned:
                return
            self._warned.add("slow")
        log.warning("%s: the server answers (a liveness probe) but sent nothing for a request in its %.2fs: "
                    "slower than that budget (loading the model, or busy); such requests are answered empty",
                    self.base_url, budget)

    def raise_for_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if status < 400:
            return
        message = error_message(response)
        if status == 429 or (status >= 500 and status not in self.not_retried):
            raise Retryable(status, retry_after(response), message)
        if status == 401:
            where = f"the API key in ${self.api_key_env} is missing or wrong" if self.api_key_env else (
                "the server wants an API key (none is configured)")
            raise BackendError(f"401 Unauthorized from {self.base_url}: {where}")
        raise BackendError(f"{status} from {self.base_url}{response.request.url.path}: {message}")


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of ``text`` could be the start of a stop string (not yet shown)."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:n]):
                hold = n
                break
    return hold


def sleep_unless_cancelled(until: float, should_cancel: Callable[[], bool] | None) -> bool:
    """Sleep until ``until``; False (at once) if ``should_cancel`` says so first."""
    while True:
        if should_cancel is not None and should_cancel():
            return False
        left = until - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(POLL_S, left))


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
    """``Retry-After`` in seconds from now: a number of seconds or an HTTP date; None if absent or unreadable."""
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


def error_message(response: httpx.Response) -> str:
    """The server's own words: ``{"error": {"message": ...}}`` (OpenAI, llama.cpp), ``{"error": "..."}``
    (Ollama), ``{"message": ...}`` (vLLM's older errors), or the body's text."""
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
