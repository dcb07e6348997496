"""``glm5-lsp serve-model``: the in-process runtime behind an OpenAI-compatible HTTP API.

One machine with a GPU can serve a team's editors; their ``OpenAIHTTPBackend`` (or any OpenAI
client) talks to it. Built on starlette + uvicorn. Endpoints: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, with ``"stream": true`` answered as
server-sent events. Requests run one at a time on the model (the backend's lock); with
``--max-pending N`` a request arriving while N are already waiting gets ``429`` with
``Retry-After`` instead of queueing forever. ``--api-key-env`` turns on bearer-token checks (401).

A completions prompt written in fill-in-the-middle form (``<|code_prefix|>P<|code_suffix|>S<|code_middle|>``),
or one with a ``suffix`` field, is split into prefix and suffix so the runtime encodes FIM tokens itself.
"""

from __future__ import annotations

import argparse
import asyncio
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
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from glm5_lsp.backends.base import Backend, BackendError, Completion, CompletionRequest
from glm5_lsp.spans import Prompt

log = logging.getLogger(__name__)

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"
MAX_TOKENS_LIMIT = 4096


class RequestError(ValueError):
    """A request body the API cannot serve (answered with 400)."""


def _error(status: int, message: str, kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status, headers=headers)


def split_fim(prompt: str, suffix: str | None) -> Prompt:
    """The API's prompt text (and optional ``suffix``) as a :class:`Prompt`."""
    if suffix:
        return Prompt(prefix=prompt, suffix=suffix)
    if prompt.startswith(FIM_PREFIX) and prompt.endswith(FIM_MIDDLE) and FIM_SUFFIX in prompt:
        body = prompt[len(FIM_PREFIX): -len(FIM_MIDDLE)]
        prefix, _, rest = body.partition(FIM_SUFFIX)
        return Prompt(prefix=prefix, suffix=rest)
    return Prompt(prefix=prompt)


def chat_prompt(messages: Any) -> Prompt:
    """Chat messages rendered as plain text for a code model: each message's content, in order."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    parts = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise RequestError("each message needs a string 'content'")
        parts.append(message["content"].rstrip("\n"))
    return Prompt(prefix="\n\n".join(parts) + "\n")


def _sampling(body: dict[str, Any], prompt: Prompt, default_max_tokens: int) -> CompletionRequest:
    def number(key: str, default: float, low: float, high: float) -> float:
        value = body.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise RequestError(f"'{key}' must be a number in [{low}, {high}]")
        return float(value)

    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
        raise RequestError("'stop' must be a string or a list of strings")
    if body.get("n", 1) not in (1, None):
        raise RequestError("only n=1 is supported")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise RequestError("'seed' must be an integer")
    return CompletionRequest(
        prompt=prompt, max_tokens=int(number("max_tokens", default_max_tokens, 1, MAX_TOKENS_LIMIT)),
        temperature=number("temperature", 0.0, 0.0, 2.0), top_p=number("top_p", 1.0, 0.0, 1.0), seed=seed, stop=stop,
    )


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


def create_app(backend: Backend, model_name: str, api_key: str | None = None, max_pending: int | None = None,
               default_max_tokens: int = 16) -> Starlette:
    """The ASGI app serving ``backend`` as ``model_name``."""
    gate = _Gate(max_pending)
    created = int(time.time())

    def authorised(request: Request) -> bool:
        if not api_key:
            return True
        header = request.headers.get("authorization", "")
        token = header[len("Bearer "):] if header.startswith("Bearer ") else ""
        return hmac.compare_digest(token.encode(), api_key.encode())

    async def models(request: Request) -> Response:
        if not authorised(request):
            return _error(401, "invalid or missing API key", "authentication_error")
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "glm5-lsp"}]})

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    async def handle(request: Request, chat: bool) -> Response:
        if not authorised(request):
            return _error(401, "invalid or missing API key", "authentication_error")
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            if chat:
                prompt = chat_prompt(body.get("messages"))
            else:
                text = body.get("prompt")
                if isinstance(text, list) and len(text) == 1:
                    text = text[0]
                if not isinstance(text, str):
                    raise RequestError("'prompt' must be a string (one prompt per request)")
                suffix = body.get("suffix")
                if suffix is not None and not isinstance(suffix, str):
                    raise RequestError("'suffix' must be a string")
                prompt = split_fim(text, suffix)
            sampling = _sampling(body, prompt, default_max_tokens)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the body is not valid JSON")
        except RequestError as error:
            return _error(400, str(error))
        release = gate.enter()
        if release is None:
            return _error(429, "the model is busy; retry shortly", "rate_limit_error", headers={"Retry-After": "1"})
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            # released when the generation ends, or after the response if the stream never started
            return StreamingResponse(stream(sampling, ident, chat, include_usage, release),
                                     media_type="text/event-stream", background=BackgroundTask(release))
        try:
            completion = await run_in_threadpool(backend.complete, sampling)
        except BackendError as error:
            return _error(500, str(error), "server_error")
        finally:
            release()
        return JSONResponse(answer(completion, ident, chat))

    def answer(completion: Completion, ident: str, chat: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": _finish(completion.finish_reason), "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": completion.text}
        else:
            choice["text"] = completion.text
        return {"id": ident, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                "model": model_name, "choices": [choice], "usage": _usage(completion)}

    def chunk(ident: str, chat: bool, text: str | None, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["delta"] = {"content": text} if text is not None else {}
        else:
            choice["text"] = text or ""
        return {"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model_name, "choices": [choice]}

    async def stream(sampling: CompletionRequest, ident: str, chat: bool, include_usage: bool,
                     release: Callable[[], None]) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancelled = threading.Event()
        sampling.on_text = lambda piece: loop.call_soon_threadsafe(queue.put_nowait, ("text", piece))
        sampling.should_cancel = cancelled.is_set

        def work() -> None:
            try:
                result: tuple[str, Any] = ("done", backend.complete(sampling))
            except Exception as error:  # reported in the stream; never takes the server down
                log.exception("streamed request failed")
                result = ("error", error)
            finally:
                release()
            loop.call_soon_threadsafe(queue.put_nowait, result)

        worker = loop.run_in_executor(None, work)
        try:
            if chat:
                first = chunk(ident, True, None, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield _sse(first)
            while True:
                kind, value = await queue.get()
                if kind == "text":
                    yield _sse(chunk(ident, chat, value, None))
                elif kind == "error":
                    yield _sse({"error": {"message": str(value), "type": "server_error", "code": 500}})
                    break
                else:
                    yield _sse(chunk(ident, chat, None if chat else "", _finish(value.finish_reason)))
                    if include_usage:
                        yield _sse({"id": ident, "object": "chat.completion.chunk" if chat else "text_completion",
                                    "created": int(time.time()), "model": model_name, "choices": [],
                                    "usage": _usage(value)})
                    break
            yield "data: [DONE]\n\n"
        finally:
            cancelled.set()  # a client that hung up stops the generation at the next token
            del worker  # it finishes on its own (and releases the gate) once cancelled

    return Starlette(routes=[
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ])


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--model-name", default=None, help="the id clients ask for (default: the folder's name)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to serve a team)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key-env", default=None,
                        help="environment variable holding the API key clients must send (default: no check)")
    parser.add_argument("--max-pending", type=int, default=None,
                        help="answer 429 when this many requests are already waiting for the model")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from glm5_lsp.backends.local import LocalBackend

    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            log.error("$%s is empty; refusing to start without the API key it should hold", args.api_key_env)
            return 2
    backend = LocalBackend(args.model, device=args.device)
    try:
        backend.load()
    except BackendError as error:
        log.error("%s", error)
        return 2
    name = args.model_name or (backend.model_path.name if backend.model_path else "glm5")
    app = create_app(backend, name, api_key=api_key, max_pending=args.max_pending)
    log.warning("serving %s at http://%s:%d/v1", name, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    return 0
