"""Local stand-ins for llama.cpp's server and Ollama that check request bodies and stream in the real formats.

The shapes are the servers' own (``tests/data/native/llamacpp_infill_stream.txt`` is a real ``llama-server``
``/infill`` stream of the exported embedded model; Ollama's ``docs/api.md``,
``tests/data/native/ollama_generate_stream.ndjson``; vLLM's ``/v1/completions`` stream,
``tests/data/native/vllm_completions_stream.txt``, is written field for field from vLLM's
``serving_completion.py`` (``completion_stream_generator``: every chunk ``model_dump_json(exclude_unset=False)``,
the finish chunk with ``stop_reason``, the usage chunk with ``choices: []``), not recorded: no GPU
here runs vLLM). A fake replays a recorded stream with the scripted text in place of the recorded
pieces, so every other field is what the real server sends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DATA = Path(__file__).parent / "data" / "native"


def recorded(name: str) -> list[dict[str, Any]]:
    """The JSON events of a recorded stream (SSE ``data:`` lines or NDJSON lines)."""
    events = []
    for line in (DATA / name).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("data:"):
            line = line[len("data:"):].strip()
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


@dataclass
class Script:
    """What the fake answers: text pieces, then a final event; or an HTTP error first."""

    pieces: list[str] = field(default_factory=lambda: ["return ", "a + b"])
    final: dict[str, Any] = field(default_factory=dict)  # merged into the recorded final event (llama.cpp: stop_type eos unless set)
    delay: float = 0.0  # seconds between pieces
    endless: bool = False  # keep streaming until the client hangs up
    error_status: int = 0  # answer this status (with the server's error body) instead of streaming
    error_message: str = ""
    error_after_pieces: bool = False  # an error event in the stream after the pieces
    failures: list[int] = field(default_factory=list)  # statuses to answer first, one per request


@dataclass
class Fake:
    script: Script = field(default_factory=Script)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    hang_ups: int = 0
    check: Callable[[str, dict[str, Any]], str | None] | None = None  # a body problem -> 400


def llamacpp_app(fake: Fake) -> Starlette:
    partial, final = recorded("llamacpp_infill_stream.txt")[0], recorded("llamacpp_infill_stream.txt")[-1]

    def error(status: int, message: str) -> JSONResponse:
        kind = {400: "invalid_request_error", 404: "not_found_error", 501: "not_supported_error",
                503: "unavailable_error"}.get(status, "server_error")
        return JSONResponse({"error": {"code": status, "message": message, "type": kind}}, status_code=status)

    async def handle(request: Request) -> Response:
        body = json.loads(await request.body())
        fake.bodies.append(body)
        fake.paths.append(request.url.path)
        script = fake.script
        if script.failures:
            return error(script.failures.pop(0), "Loading model")
        if script.error_status:
            return error(script.error_status, script.error_message)
        problem = _llamacpp_problem(request.url.path, body) or (fake.check(request.url.path, body) if fake.check else None)
        if problem:
            return error(400, problem)
        if not body.get("stream"):
            return JSONResponse({**final, "content": "".join(script.pieces), "stop_type": "eos", **script.final})

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b":\n\n"  # the server's keep-alive comment
                n = 0
                while True:
                    for piece in script.pieces:
                        n += 1
                        yield _sse({**partial, "content": piece, "tokens_predicted": n})
                        await asyncio.sleep(script.delay or 0.002)  # lets the server notice a hang-up
                    if not script.endless:
                        break
                if script.error_after_pieces:
                    yield _sse({"error": {"code": 500, "message": "the slot was released", "type": "server_error"}})
                    return
                yield _sse({**final, "tokens_predicted": n, "stop_type": "eos", **script.final})
            except asyncio.CancelledError:
                fake.hang_ups += 1
                raise

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/infill", handle, methods=["POST"]), Route("/completion", handle, methods=["POST"])])


def _llamacpp_problem(path: str, body: dict[str, Any]) -> str | None:
    """The checks llama.cpp's ``post_infill`` and its parameter schema make."""
    if path == "/infill":
        for needed in ("input_prefix", "input_suffix"):
            if needed not in body:
                return f'"{needed}" is required'
        extra = body.get("input_extra", [])
        if not isinstance(extra, list) or any(not isinstance(c, dict) or not isinstance(c.get("text"), str)
                                              or not isinstance(c.get("filename", ""), str) for c in extra):
            return '"input_extra" must be an array of {"filename": string, "text": string}'
    elif not isinstance(body.get("prompt"), str):
        return '"prompt" must be a string'
    known = {"input_prefix", "input_suffix", "input_extra", "prompt", "n_predict", "temperature", "top_p", "seed",
             "stop", "stream", "cache_prompt", "samplers", "t_max_predict_ms", "n_indent", "id_slot"}
    unknown = set(body) - known
    if unknown:
        return f"unexpected fields {sorted(unknown)}"
    if not isinstance(body.get("n_predict", 0), int) or not isinstance(body.get("stop", []), list):
        return "bad n_predict or stop"
    return None


def ollama_app(fake: Fake) -> Starlette:
    lines = recorded("ollama_generate_stream.ndjson")
    partial, final = lines[0], lines[-1]

    async def generate(request: Request) -> Response:
        body = json.loads(await request.body())
        fake.bodies.append(body)
        fake.paths.append(request.url.path)
        script = fake.script
        if script.failures:
            return JSONResponse({"error": "server busy"}, status_code=script.failures.pop(0))
        if script.error_status:
            return JSONResponse({"error": script.error_message}, status_code=script.error_status)
        problem = _ollama_problem(body) or (fake.check(request.url.path, body) if fake.check else None)
        if problem:
            return JSONResponse({"error": problem}, status_code=400)
        stamp = {"model": body["model"]}
        if not body.get("prompt") and not body.get("suffix"):  # "Load a model": nothing generated
            return JSONResponse({"model": body["model"], "created_at": final["created_at"], "response": "",
                                 "done": True, "done_reason": "load"})
        if body.get("stream") is False:
            return JSONResponse({**final, **stamp, "response": "".join(script.pieces), **script.final})

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while True:
                    for piece in script.pieces:
                        yield _line({**partial, **stamp, "response": piece})
                        await asyncio.sleep(script.delay or 0.002)  # lets the server notice a hang-up
                    if not script.endless:
                        break
                if script.error_after_pieces:
                    yield _line({"error": "an error was encountered while running the model"})
                    return
                yield _line({**final, **stamp, **script.final})
            except asyncio.CancelledError:
                fake.hang_ups += 1
                raise

        return StreamingResponse(chunks(), media_type="application/x-ndjson")

    return Starlette(routes=[Route("/api/generate", generate, methods=["POST"])])


def _ollama_problem(body: dict[str, Any]) -> str | None:
    """What Ollama's GenerateHandler refuses (server/routes.go), plus the types its API takes."""
    if not body.get("model"):
        return "model is required"
    if body.get("raw") and (body.get("template") or body.get("system") or body.get("context")):
        return "raw mode does not support template, system, or context"
    known = {"model", "prompt", "suffix", "raw", "stream", "options", "keep_alive", "format", "images", "system",
             "template", "context", "think"}
    unknown = set(body) - known
    if unknown:
        return f"unexpected fields {sorted(unknown)}"
    options = body.get("options", {})
    option_names = {"num_predict", "temperature", "top_p", "top_k", "seed", "stop", "num_ctx", "min_p"}
    if not isinstance(options, dict) or set(options) - option_names:
        return f"unexpected options {sorted(set(options) - option_names)}"
    return None


def vllm_app(fake: Fake, served: str = "Qwen/Qwen2.5-Coder-1.5B") -> Starlette:
    """vLLM's OpenAI server for ``/v1/completions``: refuses what it refuses (``suffix``, another model,
    unknown fields), streams in its chunk format, answers a whole JSON body when not streaming."""
    events = recorded("vllm_completions_stream.txt")
    partial, finish, usage = events[0], events[-2], events[-1]

    def error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                            status_code=status)

    async def completions(request: Request) -> Response:
        body = json.loads(await request.body())
        fake.bodies.append(body)
        fake.paths.append(request.url.path)
        script = fake.script
        if script.failures:
            return error(script.failures.pop(0), "the engine is not ready", "InternalServerError")
        if script.error_status:
            return error(script.error_status, script.error_message)
        if body.get("model") != served:
            return error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        problem = _vllm_problem(body) or (fake.check(request.url.path, body) if fake.check else None)
        if problem:
            return error(400, problem)
        text = "".join(script.pieces)
        if not body.get("stream"):
            return JSONResponse({**{k: v for k, v in usage.items() if k != "choices"}, "choices": [
                {**finish["choices"][0], "text": text, **script.final}]})

        async def chunks() -> AsyncIterator[bytes]:
            try:
                while True:
                    for piece in script.pieces:
                        yield _sse({**partial, "choices": [{**partial["choices"][0], "text": piece}]})
                        await asyncio.sleep(script.delay or 0.002)  # lets the server notice a hang-up
                    if not script.endless:
                        break
                if script.error_after_pieces:
                    yield _sse({"error": {"message": "the engine died", "type": "InternalServerError",
                                          "param": None, "code": 500}})
                    return
                yield _sse({**finish, "choices": [{**finish["choices"][0], **script.final}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield _sse(usage)
                yield b"data: [DONE]\n\n"
            except asyncio.CancelledError:
                fake.hang_ups += 1
                raise

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


def _vllm_problem(body: dict[str, Any]) -> str | None:
    """What vLLM's ``CompletionRequest`` and ``serving_completion.py`` refuse."""
    if body.get("suffix") is not None:
        return "suffix is not currently supported"
    if not isinstance(body.get("prompt"), str):
        return "prompt must be a string"
    known = {"model", "prompt", "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options",
             "echo", "logprobs", "n", "best_of", "user", "presence_penalty", "frequency_penalty", "suffix"}
    unknown = set(body) - known
    if unknown:
        return f"unexpected fields {sorted(unknown)}"
    if not isinstance(body.get("stop", []), list) or not all(isinstance(s, str) for s in body.get("stop", [])):
        return "stop must be a list of strings"
    return None


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _line(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, separators=(",", ":")) + "\n").encode()
