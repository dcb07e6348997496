"""``glm5-lsp serve-model``: the in-process runtime behind an OpenAI-compatible HTTP API.

One machine with a GPU can serve a team's editors; their ``OpenAIHTTPBackend`` (or any OpenAI
client) talks to it. Built on starlette + uvicorn. Endpoints: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, with ``"stream": true`` answered as
server-sent events. Requests run one at a time on the model (the backend's lock); with
``--max-pending N`` a request arriving while N are already waiting gets ``429`` with
``Retry-After`` instead of queueing forever. ``--api-key-env`` turns on bearer-token checks (401).

Bounded against careless and hostile clients (:class:`ServeLimits`): a body over
``--max-body-bytes`` gets 413 before it is read, a prompt over ``--max-prompt-tokens`` or a
``max_tokens`` over ``--max-tokens-limit`` gets 400 before it reaches the model, and every field is
checked (types, ranges, a seed that fits 64 bits, text that is valid Unicode, JSON that does not nest
past the parser's depth): a bad request is answered 400 with an OpenAI-shaped error body, never
500. A request's place among the pending ones is given back however it ends; a client that hangs
up cancels its generation at the next token; SIGTERM ends the generations in progress and stops.

A completions prompt written in fill-in-the-middle form (``<|code_prefix|>P<|code_suffix|>S<|code_middle|>``),
or one with a ``suffix`` field, is split into prefix and suffix so the runtime encodes FIM tokens itself.

Answered as OpenAI answers:

- **An unknown ``model``** is 404 with OpenAI's body (``"code": "model_not_found"``); a request that
  names no model gets the one served. ``GET /v1/models/{id}`` answers the same way.
- **``logprobs``** (``/v1/completions``: an integer, the top-N alternatives per token, at most
  ``MAX_LOGPROBS``; chat: ``logprobs: true`` and ``top_logprobs``) gives each generated token's
  log-probability under the model (the distribution before temperature and top-p, as OpenAI's), with
  the chosen token always among its alternatives. Streamed, each chunk carries its own tokens.
- **``echo``** (``/v1/completions``) puts the prompt before the completion; with ``logprobs`` the
  prompt's tokens are scored too (the first one has ``null``, nothing precedes it), in one forward
  pass. ``echo`` with ``max_tokens: 0`` scores a text without generating: how a main model rates a
  light model's candidates.

Token probabilities need the model itself: :class:`RuntimeScorer` reads them from the in-process
runtime (``LocalBackend``); a server over another backend answers ``logprobs`` with 400, never by
ignoring it.

``glm5-lsp serve-model`` listens on 127.0.0.1 unless ``--host`` says otherwise. It binds its socket
before loading the model (a busy port fails at once with a message naming it, exit status 2), and
logs "serving NAME at URL" only once the server accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import hmac
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from glm5_lsp.pipeline.session import (
    Backend,
    BackendError,
    Completion,
    CompletionRequest,
    LocalBackend,
    RuntimeScorer,
    TokenScore,
    fit_to_text,
)
from glm5_lsp.spans import Prompt
from glm5_lsp.threads import add_threads_argument, use_threads

log = logging.getLogger(__name__)

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"
MAX_TOKENS_LIMIT = 4096
MAX_LOGPROBS = 20  # the most alternatives per token a request may ask for (OpenAI's top_logprobs limit)
SHUTDOWN_GRACE_S = 2  # after SIGTERM, how long open connections may take to finish


class RequestError(ValueError):
    """A request the API cannot serve: answered with ``status`` (400 by default) and an OpenAI-shaped body."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask of the server (``serve-model``'s flags; each refused with 400 or 413)."""

    max_body_bytes: int = 512 * 1024  # the request body, refused with 413 before it is read
    max_prompt_tokens: int = 4096  # the prompt (prefix and suffix) in the model's tokens
    max_tokens: int = MAX_TOKENS_LIMIT  # the most ``max_tokens`` a request may ask for
    default_max_tokens: int = 16  # ``max_tokens`` when a request does not say (OpenAI's default)
    max_pending: int | None = None  # requests waiting for or holding the model; past it, 429

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_prompt_tokens", "max_tokens", "default_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_pending is not None and self.max_pending < 1:
            raise ValueError("max_pending must be at least 1")


@dataclass(frozen=True)
class TokenCounter:
    """How ``serve-model`` measures a prompt: ``count(text)`` tokens; ``longest`` characters in the
    longest token, so a text longer than ``limit * longest`` is refused without being tokenized.
    The default (one token per character) is an upper bound for any tokenizer."""

    count: Callable[[str], int] = len
    longest: int = 1

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> TokenCounter:
        longest = max((len(piece) for piece in tokenizer.token_strings()), default=1)
        return cls(lambda text: len(tokenizer.encode(text)), max(1, longest))


def _error(status: int, message: str, kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                        status_code=status, headers=headers)


def model_not_found(model: str, served: str) -> JSONResponse:
    """OpenAI's answer to a model it does not have: 404, ``model_not_found``."""
    return JSONResponse({"error": {
        "message": f"The model `{model}` does not exist or you do not have access to it. "
                   f"This server serves `{served}` (GET /v1/models).",
        "type": "invalid_request_error", "param": None, "code": "model_not_found"}}, status_code=404)


def split_fim(prompt: str, suffix: str | None) -> Prompt:
    """The API's prompt text (and optional ``suffix``) as a :class:`Prompt`."""
    if suffix:
        return Prompt(prefix=prompt, suffix=suffix)
    if prompt.startswith(FIM_PREFIX) and prompt.endswith(FIM_MIDDLE) and FIM_SUFFIX in prompt:
        body = prompt[len(FIM_PREFIX): -len(FIM_MIDDLE)]
        prefix, _, rest = body.partition(FIM_SUFFIX)
        return Prompt(prefix=prefix, suffix=rest)
    return Prompt(prefix=prompt)


def _text(name: str, value: Any) -> str:
    """A string field, refused if it is not a string or holds a lone surrogate (no UTF-8 for it)."""
    if not isinstance(value, str):
        raise RequestError(f"'{name}' must be a string, got {_kind(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RequestError(f"'{name}' holds a lone surrogate (U+{ord(value[error.start]):04X}) at character "
                           f"{error.start}: not valid Unicode text") from None
    return value


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def chat_prompt(messages: Any) -> Prompt:
    """Chat messages rendered as plain text for a code model: each message's content, in order."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    parts = []
    for number, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"'messages[{number}]' must be an object with 'role' and 'content'")
        if "role" in message:
            _text(f"messages[{number}].role", message["role"])
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text ones
            texts = []
            for index, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise RequestError(f"'messages[{number}].content[{index}]' must be a text part")
                texts.append(_text(f"messages[{number}].content[{index}].text", part.get("text")))
            content = "".join(texts)
        parts.append(_text(f"messages[{number}].content", content).rstrip("\n"))
    return Prompt(prefix="\n\n".join(parts) + "\n")


def _integer(body: dict[str, Any], key: str, default: int | None, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"'{key}' must be an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise RequestError(f"'{key}' must be in [{low}, {high}], got {value}")
    return value


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{key}' must be a number, got {_kind(value)}")
    if not low <= value <= high:  # NaN fails this too
        raise RequestError(f"'{key}' must be a number in [{low}, {high}]")
    return float(value)


def _boolean(value: Any, key: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"'{key}' must be true or false, got {_kind(value)}")
    return value


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives per token the request wants (0: only the chosen token's), None: no logprobs.
    ``/v1/completions`` says it with an integer ``logprobs``; chat with ``logprobs: true`` and ``top_logprobs``."""
    if chat:
        wanted = _boolean(body.get("logprobs"), "logprobs")
        top = _integer(body, "top_logprobs", None, 0, MAX_LOGPROBS)
        if top is not None and not wanted:
            raise RequestError("'top_logprobs' needs 'logprobs': true")
        return (top or 0) if wanted else None
    value = body.get("logprobs")
    if value is None or value is False:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise RequestError(f"'logprobs' must be an integer in [0, {MAX_LOGPROBS}] (the alternatives per token), "
                           f"got {json.dumps(value)[:40]}")
    return value


@dataclass
class ParsedRequest:
    sampling: CompletionRequest
    stream: bool
    include_usage: bool
    echo: bool = False  # /v1/completions: the prompt goes before the completion
    echo_text: str = ""  # the prompt as the request wrote it
    logprobs: int | None = None  # alternatives per token; None: no logprobs


def parse_request(body: Any, chat: bool, limits: ServeLimits) -> ParsedRequest:
    """A request body checked field by field (:class:`RequestError` names the first bad one)."""
    if not isinstance(body, dict):
        raise RequestError(f"the body must be a JSON object, got {_kind(body)}")
    if body.get("model") is not None:
        _text("model", body["model"])
    text = ""
    if chat:
        prompt = chat_prompt(body.get("messages"))
    else:
        text = body.get("prompt")
        if isinstance(text, list) and len(text) == 1:
            text = text[0]
        if text is None or isinstance(text, list):
            raise RequestError("'prompt' must be a string (one prompt per request)")
        text = _text("prompt", text)
        suffix = body.get("suffix")
        prompt = split_fim(text, None if suffix is None else _text("suffix", suffix))
    echo = _boolean(body.get("echo"), "echo")
    if echo and chat:
        raise RequestError("'echo' is for /v1/completions; chat completions have no prompt to echo")
    if echo and body.get("suffix") is not None:
        raise RequestError("'echo' cannot be used with 'suffix': there is no one text to put the prompt before")
    logprobs = _logprobs(body, chat)
    stop = body.get("stop")
    stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 16:
        raise RequestError("'stop' must be a string or a list of at most 16 strings")
    stop = [_text(f"stop[{index}]", item) for index, item in enumerate(stop)]
    if body.get("n") is not None and (isinstance(body["n"], bool) or body["n"] != 1):
        raise RequestError("only n=1 is supported")
    if body.get("best_of") not in (None, 1):
        raise RequestError("only best_of=1 is supported")
    if body.get("user") is not None:
        _text("user", body["user"])
    stream = _boolean(body.get("stream"), "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"'stream_options' must be an object, got {_kind(options)}")
    include_usage = _boolean((options or {}).get("include_usage"), "stream_options.include_usage")
    max_tokens_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    # max_tokens 0 only with echo: the prompt scored, nothing generated
    max_tokens = _integer(body, max_tokens_key, limits.default_max_tokens, 0 if echo else 1, limits.max_tokens)
    assert max_tokens is not None
    sampling = CompletionRequest(
        prompt=prompt, max_tokens=max_tokens, temperature=_number(body, "temperature", 0.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0), seed=_integer(body, "seed", None, -(2**63), 2**63 - 1),
        stop=stop,
    )
    if sampling.top_p == 0.0:
        raise RequestError("'top_p' must be greater than 0")
    return ParsedRequest(sampling, stream, include_usage, echo=echo, echo_text=text if echo else "", logprobs=logprobs)


# ---- token log-probabilities ----------------------------------------------------------------------




def completion_logprobs(scores: list[TokenScore], offset: int = 0) -> dict[str, Any]:
    """``/v1/completions``' ``logprobs`` object; ``offset``: where the first token starts in the choice's text."""
    offsets = []
    for score in scores:
        offsets.append(offset)
        offset += len(score.token)
    return {
        "tokens": [score.token for score in scores],
        "token_logprobs": [score.logprob for score in scores],
        "top_logprobs": [None if score.top is None else _top_dict(score.top) for score in scores],
        "text_offset": offsets,
    }


def _top_dict(top: tuple[tuple[str, float], ...]) -> dict[str, float]:
    best: dict[str, float] = {}
    for name, value in top:  # best first: a name two tokens share keeps the better one
        best.setdefault(name, value)
    return best


def chat_logprobs(scores: list[TokenScore], top: int) -> dict[str, Any]:
    """Chat completions' ``logprobs`` object: ``content``, one entry per token."""
    def entry(token: str, logprob: float | None) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [{**entry(score.token, score.logprob),
                         "top_logprobs": [entry(name, value) for name, value in (score.top or ())[:top]]}
                        for score in scores], "refusal": None}


class _Gate:
    """Counts requests waiting for or holding the model; refuses one past ``max_pending``."""

    def __init__(self, max_pending: int | None) -> None:
        self.max_pending = max_pending
        self.pending = 0
        self._lock = threading.Lock()

    def enter(self) -> Callable[[], None] | None:
        """A release function (safe to call more than once), or None when the request must wait."""
        with self._lock:
            if self.max_pending is not None and self.pending >= self.max_pending:
                return None
            self.pending += 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if not released.is_set():
                    released.set()
                    self.pending -= 1

        return release


class _ReleaseAfter:
    """An ASGI response that gives the request's place back however it ends: sent, failed, or the
    client gone (Starlette's background tasks do not run when sending fails)."""

    def __init__(self, response: Response, release: Callable[[], None]) -> None:
        self.response, self.release = response, release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.release()


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(f"Content-Length must be a number of bytes, got {declared[:40]!r}")
        if int(declared) > limit:
            raise RequestError(f"the body is {int(declared)} bytes; this server takes at most {limit} "
                               f"(serve-model --max-body-bytes)", 413)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"the body is over {limit} bytes, the most this server takes "
                               f"(serve-model --max-body-bytes)", 413)
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait_for_disconnect(request: Request, cancelled: threading.Event) -> None:
    """Set ``cancelled`` when the client goes away (the body is read by then: the next message is that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            cancelled.set()
            return


def create_app(backend: Backend, model_name: str, api_key: str | None = None, max_pending: int | None = None,
               default_max_tokens: int = 16, *, limits: ServeLimits | None = None,
               tokens: TokenCounter | None = None, stopping: threading.Event | None = None,
               scorer: RuntimeScorer | None = None) -> Starlette:
    """The ASGI app serving ``backend`` as ``model_name``.

    ``limits`` bounds each request (``max_pending`` and ``default_max_tokens``, when given, override
    its fields); ``tokens`` measures prompts (default: a character count, an upper bound);
    ``stopping``, once set, cancels every generation at its next token (the server is shutting down);
    ``scorer`` gives token log-probabilities (default: a :class:`RuntimeScorer` when ``backend`` is the
    in-process runtime; without one, ``logprobs`` is answered 400).
    """
    limits = limits or ServeLimits()
    if max_pending is not None or default_max_tokens != 16:
        limits = replace(limits, max_pending=max_pending if max_pending is not None else limits.max_pending,
                         default_max_tokens=default_max_tokens if default_max_tokens != 16 else limits.default_max_tokens)
    tokens = tokens or TokenCounter()
    stopping = stopping or threading.Event()
    if scorer is None and isinstance(backend, LocalBackend):
        scorer = RuntimeScorer(backend)
    gate = _Gate(limits.max_pending)
    created = int(time.time())
    model_card = {"id": model_name, "object": "model", "created": created, "owned_by": "glm5-lsp"}

    def authorised(request: Request) -> bool:
        if not api_key:
            return True
        header = request.headers.get("authorization", "")
        token = header[len("Bearer "):] if header.startswith("Bearer ") else ""
        return hmac.compare_digest(token.encode(), api_key.encode())

    async def models(request: Request) -> Response:
        if not authorised(request):
            return _error(401, "invalid or missing API key", "authentication_error")
        return JSONResponse({"object": "list", "data": [model_card]})

    async def one_model(request: Request) -> Response:
        if not authorised(request):
            return _error(401, "invalid or missing API key", "authentication_error")
        wanted = request.path_params["model"]
        return JSONResponse(model_card) if wanted == model_name else model_not_found(wanted, model_name)

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    def check_prompt(prompt: Prompt) -> None:
        text = prompt.prefix + prompt.suffix
        limit = limits.max_prompt_tokens
        if len(text) > limit * tokens.longest:  # more tokens than the limit, whatever the tokenizer does
            raise RequestError(f"the prompt has {len(text)} characters, more than {limit} tokens can hold; "
                               f"this server takes at most {limit} prompt tokens (serve-model --max-prompt-tokens)")
        count = tokens.count(prompt.prefix) + tokens.count(prompt.suffix)
        if count > limit:
            raise RequestError(f"the prompt has {count} tokens; this server takes at most {limit} "
                               f"(serve-model --max-prompt-tokens)")

    async def handle(request: Request, chat: bool) -> Response:
        if not authorised(request):
            return _error(401, "invalid or missing API key", "authentication_error")
        if stopping.is_set():
            return _error(503, "the server is shutting down", "server_error", headers={"Retry-After": "5"})
        try:
            raw = await _read_body(request, limits.max_body_bytes)
            try:
                body = json.loads(raw)
            except RecursionError:
                raise RequestError("the body nests too deeply") from None
            except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, an integer of 5,000 digits
                raise RequestError(f"the body is not valid JSON ({error})") from None
            parsed = parse_request(body, chat, limits)
            wanted = body.get("model")
            if wanted is not None and wanted != model_name:
                return model_not_found(wanted, model_name)
            if parsed.logprobs is not None and scorer is None:
                raise RequestError(f"'logprobs' needs the model's token probabilities, and this server's "
                                   f"{getattr(backend, 'name', 'model')} backend does not give them")
            await run_in_threadpool(check_prompt, parsed.sampling.prompt)
        except RequestError as error:
            return _error(error.status, str(error))
        release = gate.enter()
        if release is None:
            return _error(429, "the model is busy; retry shortly", "rate_limit_error", headers={"Retry-After": "1"})
        try:
            ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            if parsed.stream:
                response: Response = StreamingResponse(
                    stream(request, parsed, ident, chat, release), media_type="text/event-stream")
            else:
                response = await complete(request, parsed, ident, chat)
        except BaseException:
            release()
            raise
        return _ReleaseAfter(response, release)  # type: ignore[return-value]

    def run_model(parsed: ParsedRequest, on_echo: Callable[[list[TokenScore] | None], None] | None = None,
                  on_scores: Callable[[list[TokenScore]], None] | None = None) -> _Result:
        """The request on the model, in a worker thread: the echoed prompt's scores, then the completion."""
        sampling = parsed.sampling
        prompt_scores = None
        if parsed.echo and parsed.logprobs is not None:
            assert scorer is not None
            prompt_scores = fit_to_text(scorer.score_prompt(sampling.prompt, parsed.logprobs), parsed.echo_text)
        if on_echo is not None:
            on_echo(prompt_scores)
        if sampling.max_tokens == 0:  # echo alone: the prompt scored, nothing generated
            if prompt_scores is not None:
                count = len(prompt_scores)
            elif scorer is not None:
                count = len(scorer.prompt_ids(sampling.prompt))
            else:
                count = tokens.count(sampling.prompt.prefix)
            return _Result(Completion(text="", finish_reason="length", prompt_tokens=count), prompt_scores)
        if parsed.logprobs is not None:
            assert scorer is not None
            completion, scores = scorer.generate(sampling, parsed.logprobs, on_scores)
            return _Result(completion, prompt_scores, scores)
        return _Result(backend.complete(sampling), prompt_scores)

    async def complete(request: Request, parsed: ParsedRequest, ident: str, chat: bool) -> Response:
        cancelled = threading.Event()
        parsed.sampling.should_cancel = lambda: cancelled.is_set() or stopping.is_set()
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(None, run_model, parsed)
        watch = asyncio.ensure_future(_wait_for_disconnect(request, cancelled))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client hung up: the generation stops at its next token
                log.info("%s: the client went away; generation cancelled", ident)
                return Response(status_code=499)
            result = work.result()
        except BackendError as error:
            return _error(500, str(error), "server_error")
        except Exception:  # logged; the client gets an OpenAI-shaped 500, the server stays up
            log.exception("%s failed", ident)
            return _error(500, "the model failed on this request (see the server's log)", "server_error")
        finally:
            watch.cancel()
        if stopping.is_set() and result.completion.finish_reason == "cancelled":
            return _error(503, "the server is shutting down", "server_error", headers={"Retry-After": "5"})
        return JSONResponse(answer(result, parsed, ident, chat))

    def logprobs_of(scores: list[TokenScore], parsed: ParsedRequest, chat: bool, offset: int) -> dict[str, Any]:
        assert parsed.logprobs is not None
        return chat_logprobs(scores, parsed.logprobs) if chat else completion_logprobs(scores, offset)

    def answer(result: _Result, parsed: ParsedRequest, ident: str, chat: bool) -> dict[str, Any]:
        completion = result.completion
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(completion.finish_reason), "logprobs": None}
        if parsed.logprobs is not None:
            choice["logprobs"] = logprobs_of([*(result.prompt_scores or ()), *(result.scores or ())], parsed, chat, 0)
        if chat:
            choice["message"] = {"role": "assistant", "content": completion.text}
        else:
            choice["text"] = parsed.echo_text + completion.text if parsed.echo else completion.text
        return {"id": ident, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": model_name, "choices": [choice], "usage": _usage(completion)}

    def chunk(ident: str, chat: bool, text: str | None, finish: str | None,
              logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if chat:
            choice["delta"] = {"content": text} if text is not None else {}
        else:
            choice["text"] = text or ""
        return {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model_name, "choices": [choice]}

    async def stream(request: Request, parsed: ParsedRequest, ident: str, chat: bool,
                     release: Callable[[], None]) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancelled = threading.Event()
        sampling = parsed.sampling

        def post(kind: str, value: Any) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        sampling.on_text = lambda piece: post("text", piece)
        sampling.should_cancel = lambda: cancelled.is_set() or stopping.is_set()

        def work() -> None:
            try:
                result: tuple[str, Any] = ("done", run_model(
                    parsed, on_echo=(lambda scores: post("echo", scores)) if parsed.echo else None,
                    on_scores=lambda scores: post("scores", scores)))
            except Exception as error:  # reported in the stream; never takes the server down
                log.exception("streamed request failed")
                result = ("error", error)
            finally:
                release()
            post(*result)

        watch = asyncio.ensure_future(_wait_for_disconnect(request, cancelled))
        worker = loop.run_in_executor(None, work)
        with_logprobs = parsed.logprobs is not None
        base = 0  # where the completion starts in the choice's text (after an echoed prompt)
        safe = ""  # the completion's text streamed by the model so far
        sent = 0  # of which this many characters are in chunks already
        known: list[TokenScore] = []  # the completion's tokens scored so far, and where each ends
        ends: list[int] = []
        done_tokens = 0  # of which this many are in chunks already

        def scored_chunks() -> Iterator[str]:
            """A chunk of the text up to the last token both streamed and scored, with those tokens."""
            nonlocal sent, done_tokens
            upto = done_tokens
            while upto < len(known) and ends[upto] <= len(safe):
                upto += 1
            if upto > done_tokens:
                text = safe[sent:ends[upto - 1]]
                scores = logprobs_of(known[done_tokens:upto], parsed, chat, base + sent)
                yield _sse(chunk(ident, chat, text, None, scores))
                sent, done_tokens = ends[upto - 1], upto

        try:
            if chat:
                first = chunk(ident, True, None, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield _sse(first)
            while True:
                kind, value = await queue.get()
                if kind == "echo":
                    logprobs = logprobs_of(value or [], parsed, chat, 0) if with_logprobs else None
                    yield _sse(chunk(ident, chat, parsed.echo_text, None, logprobs))
                    base = len(parsed.echo_text)
                elif kind == "text" and not with_logprobs:
                    yield _sse(chunk(ident, chat, value, None))
                elif kind == "text":
                    safe += value
                    for line in scored_chunks():
                        yield line
                elif kind == "scores":
                    for score in value:
                        ends.append((ends[-1] if ends else 0) + len(score.token))
                        known.append(score)
                    for line in scored_chunks():
                        yield line
                elif kind == "error":
                    message = str(value) if isinstance(value, BackendError) else "the model failed on this request"
                    yield _sse({"error": {"message": message, "type": "server_error", "param": None, "code": 500}})
                    break
                else:
                    result: _Result = value
                    completion = result.completion
                    if with_logprobs:
                        rest = (result.scores or [])[done_tokens:]
                        if rest or len(completion.text) > sent:
                            yield _sse(chunk(ident, chat, completion.text[sent:], None,
                                             logprobs_of(rest, parsed, chat, base + sent)))
                    yield _sse(chunk(ident, chat, None if chat else "", _finish(completion.finish_reason)))
                    if parsed.include_usage:
                        yield _sse({"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                                    "created": int(time.time()), "model": model_name, "choices": [],
                                    "usage": _usage(completion)})
                    break
            yield "data: [DONE]\n\n"
        finally:
            cancelled.set()  # a client that hung up stops the generation at the next token
            watch.cancel()
            del worker  # it finishes on its own (and releases the gate) once cancelled

    async def not_found(request: Request, error: Exception) -> Response:
        status = getattr(error, "status_code", 404)
        return _error(status, f"{request.method} {request.url.path}: {getattr(error, 'detail', 'not found')}")

    async def failed(request: Request, error: Exception) -> Response:
        log.error("%s %s failed", request.method, request.url.path, exc_info=error)
        return _error(500, "internal error (see the server's log)", "server_error")

    return Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", one_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ], exception_handlers={HTTPException: not_found, Exception: failed})


@dataclass
class _Result:
    """What the model made of one request: the completion, the echoed prompt's scores and the
    completion's tokens' scores (each None unless asked for)."""

    completion: Completion
    prompt_scores: list[TokenScore] | None = None
    scores: list[TokenScore] | None = None


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _finish(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _usage(completion: Completion) -> dict[str, int]:
    return {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens}


# ---- running the server -------------------------------------------------------------------------


@contextmanager
def serve_in_thread(app: Starlette, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``app`` on a free port in a background thread; yields the base URL, stops on exit."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ServeLimits()
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--model-name", default=None, help="the id clients ask for (default: the folder's name)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    add_threads_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to serve a team)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key-env", default=None,
                        help="environment variable holding the API key clients must send (default: no check)")
    parser.add_argument("--max-pending", type=_at_least_one, default=None,
                        help="answer 429 when this many requests are already waiting for the model")
    parser.add_argument("--max-body-bytes", type=_at_least_one, default=defaults.max_body_bytes,
                        help=f"largest request body; a larger one gets 413 unread (default {defaults.max_body_bytes})")
    parser.add_argument("--max-prompt-tokens", type=_at_least_one, default=defaults.max_prompt_tokens,
                        help=f"longest prompt in tokens; a longer one gets 400 (default {defaults.max_prompt_tokens})")
    parser.add_argument("--max-tokens-limit", type=_at_least_one, default=defaults.max_tokens,
                        help=f"the most max_tokens a request may ask for (default {defaults.max_tokens})")


class BindError(OSError):
    """The address cannot be listened on; the message says which and why."""


_BIND_REASONS = {
    errno.EADDRINUSE: "the address is already in use (another server is listening there; pick another --port)",
    errno.EACCES: "permission denied (ports below 1024 need privileges; pick a --port above 1023)",
    errno.EADDRNOTAVAIL: "this machine has no such address (check --host)",
}


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free one), not yet listening, or :class:`BindError`."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as error:
        raise BindError(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT, never one in use
    try:
        sock.bind(address)
    except OSError as error:
        sock.close()
        reason = _BIND_REASONS.get(error.errno or 0, error.strerror or str(error))
        raise BindError(f"cannot listen on {host}:{port}: {reason}") from None
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"


def serve(app: Starlette, host: str, port: int, stopping: threading.Event, log_level: str = "warning",
          *, sock: socket.socket | None = None, name: str | None = None) -> None:
    """Serve ``app`` until SIGTERM or SIGINT, on ``sock`` (bound by :func:`bind_socket`) or else on
    ``host:port`` (:class:`BindError` when it cannot be bound). "serving NAME at URL" is logged once
    the server accepts connections, never before. The signal sets ``stopping`` first (the app's, see
    :func:`create_app`): every generation then ends at its next token and new requests get 503, so
    the graceful shutdown has nothing long to wait for (and waits at most ``SHUTDOWN_GRACE_S``)."""
    import uvicorn

    listening = sock if sock is not None else bind_socket(host, port)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not stopping.is_set():
                log.warning("signal %d: stopping; the generations in progress end now", sig)
            stopping.set()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started and not self.should_exit:
                log.warning("serving %s at %s", name or "the model", _url(listening))

    try:
        Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=SHUTDOWN_GRACE_S)).run(
            sockets=[listening])
    finally:
        listening.close()


def run(args: argparse.Namespace) -> int:
    use_threads(args.threads, "serve-model")
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            log.error("$%s is empty; refusing to start without the API key it should hold", args.api_key_env)
            return 2
    try:  # before loading the model: a busy port is said at once, not after the weights load
        sock = bind_socket(args.host, args.port)
    except BindError as error:
        log.error("%s", error)
        return 2
    try:
        backend = LocalBackend(args.model, device=args.device)
        try:
            backend.load()
        except BackendError as error:
            log.error("%s", error)
            return 2
        name = args.model_name or (backend.model_path.name if backend.model_path else "glm5")
        limits = ServeLimits(max_body_bytes=args.max_body_bytes, max_prompt_tokens=args.max_prompt_tokens,
                             max_tokens=args.max_tokens_limit, max_pending=args.max_pending)
        stopping = threading.Event()
        app = create_app(backend, name, api_key=api_key, limits=limits,
                         tokens=TokenCounter.for_tokenizer(backend.tokenizer), stopping=stopping)
        serve(app, args.host, args.port, stopping, "info" if args.verbose else "warning", sock=sock, name=name)
    finally:
        sock.close()
    return 0
