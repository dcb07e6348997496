"""``serve-model`` under careless and hostile clients: limits, validation, pending slots, disconnects, SIGTERM.

The app serves test doubles (``tests/data/serve_model/slow_backend.py``) here: what is under test is
the HTTP layer. The last test runs the real ``glm5-lsp serve-model`` on a tiny checkpoint.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from glm5_lsp.serve_model import ServeLimits, TokenCounter, create_app, serve_in_thread

DATA = Path(__file__).parent / "data" / "serve_model"
ROOT = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("slow_backend", DATA / "slow_backend.py")
assert _spec and _spec.loader
doubles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doubles)


def post(url: str, body: Any, path: str = "/v1/completions", raw: bytes | None = None, **options: Any) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={"Content-Type": "application/json"},
                      timeout=options.pop("timeout", 30), **options)


def assert_openai_error(response: httpx.Response, status: int, words: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["type"] and words in error["message"], error


def test_a_1mb_prompt_is_refused_at_once() -> None:
    backend = doubles.SlowBackend()
    with serve_in_thread(create_app(backend, "m")) as url:
        begun = time.monotonic()
        assert_openai_error(post(url, {"prompt": "x" * 1_000_000}), 413, "--max-body-bytes")
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.APIStatusError) as raised:
            client.completions.create(model="m", prompt="y" * 1_000_000)
        assert raised.value.status_code == 413
        assert time.monotonic() - begun < 2
    roomy = ServeLimits(max_body_bytes=4_000_000)  # the body fits: the prompt's length is what is refused
    with serve_in_thread(create_app(backend, "m", limits=roomy, tokens=TokenCounter(len, 16))) as url:
        begun = time.monotonic()
        assert_openai_error(post(url, {"prompt": "x" * 1_000_000}), 400, "at most 4096 prompt tokens")
        assert time.monotonic() - begun < 2
    assert backend.started == []  # the model never saw either


def test_prompt_tokens_are_counted_with_the_tokenizer() -> None:
    words = TokenCounter(lambda text: len(text.split()), longest=64)
    limits = ServeLimits(max_prompt_tokens=100, max_tokens=50)
    backend = doubles.SlowBackend(pieces=2, interval=0)
    with serve_in_thread(create_app(backend, "m", limits=limits, tokens=words)) as url:
        assert_openai_error(post(url, {"prompt": "a " * 101}), 400, "has 101 tokens")
        assert_openai_error(post(url, {"prompt": "a " * 60, "suffix": "b " * 41}), 400, "has 101 tokens")
        assert_openai_error(post(url, {"prompt": "a", "max_tokens": 51}), 400, "'max_tokens' must be in [1, 50]")
        assert post(url, {"prompt": "a " * 100, "max_tokens": 50}).status_code == 200
        chat = {"messages": [{"role": "user", "content": "a " * 200}]}
        assert_openai_error(post(url, chat, "/v1/chat/completions"), 400, "tokens")


DEEP = b'{"prompt": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BAD_BODIES: list[tuple[str, str, bytes, str]] = [
    ("stream-options-list", "/v1/completions", b'{"prompt": "x", "stream": true, "stream_options": [1]}', "stream_options"),
    ("stream-options-usage", "/v1/completions",
     b'{"prompt": "x", "stream": true, "stream_options": {"include_usage": "yes"}}', "include_usage"),
    ("huge-seed", "/v1/completions", json.dumps({"prompt": "x", "seed": 2**80}).encode(), "'seed'"),
    ("lone-surrogate", "/v1/completions", b'{"prompt": "def f(\\ud800):"}', "lone surrogate"),
    ("lone-surrogate-stop", "/v1/completions", b'{"prompt": "x", "stop": ["\\udfff"]}', "lone surrogate"),
    ("lone-surrogate-chat", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "\\ud83d"}]}', "lone surrogate"),
    ("deep-nesting", "/v1/completions", DEEP, "nests too deeply"),
    ("not-json", "/v1/completions", b"{prompt: x", "not valid JSON"),
    ("not-utf8", "/v1/completions", b'{"prompt": "\xff\xfe\xfa"}', "not valid JSON"),
    ("empty-body", "/v1/completions", b"", "not valid JSON"),
    ("array-body", "/v1/completions", b'[{"prompt": "x"}]', "JSON object"),
    ("huge-integer", "/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ("prompt-number", "/v1/completions", b'{"prompt": 5}', "'prompt' must be a string"),
    ("prompt-missing", "/v1/completions", b'{"max_tokens": 5}', "'prompt' must be a string"),
    ("prompt-two", "/v1/completions", b'{"prompt": ["a", "b"]}', "one prompt per request"),
    ("suffix-number", "/v1/completions", b'{"prompt": "x", "suffix": 3}', "'suffix' must be a string"),
    ("max-tokens-string", "/v1/completions", b'{"prompt": "x", "max_tokens": "8"}', "'max_tokens' must be an integer"),
    ("max-tokens-float", "/v1/completions", b'{"prompt": "x", "max_tokens": 8.5}', "'max_tokens' must be an integer"),
    ("max-tokens-zero", "/v1/completions", b'{"prompt": "x", "max_tokens": 0}', "'max_tokens' must be in"),
    ("temperature-string", "/v1/completions", b'{"prompt": "x", "temperature": "hot"}', "'temperature' must be a number"),
    ("temperature-nan", "/v1/completions", b'{"prompt": "x", "temperature": NaN}', "'temperature'"),
    ("top-p-zero", "/v1/completions", b'{"prompt": "x", "top_p": 0}', "'top_p'"),
    ("seed-bool", "/v1/completions", b'{"prompt": "x", "seed": true}', "'seed' must be an integer"),
    ("stream-string", "/v1/completions", b'{"prompt": "x", "stream": "yes"}', "'stream' must be true or false"),
    ("stop-number", "/v1/completions", b'{"prompt": "x", "stop": [1]}', "must be a string"),
    ("stop-object", "/v1/completions", b'{"prompt": "x", "stop": {"a": 1}}', "'stop'"),
    ("n-two", "/v1/completions", b'{"prompt": "x", "n": 2}', "n=1"),
    ("model-number", "/v1/completions", b'{"prompt": "x", "model": 7}', "'model' must be a string"),
    ("echo-suffix", "/v1/completions", b'{"prompt": "x", "suffix": "y", "echo": true}', "'echo' cannot be used with 'suffix'"),
    ("echo-chat", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "echo": true}',
     "'echo' is for /v1/completions"),
    ("echo-string", "/v1/completions", b'{"prompt": "x", "echo": "yes"}', "'echo' must be true or false"),
    ("logprobs-bool", "/v1/completions", b'{"prompt": "x", "logprobs": true}', "'logprobs' must be an integer in [0, 20]"),
    ("logprobs-21", "/v1/completions", b'{"prompt": "x", "logprobs": 21}', "'logprobs' must be an integer in [0, 20]"),
    ("logprobs-unscored", "/v1/completions", b'{"prompt": "x", "logprobs": 2}', "does not give them"),
    ("top-logprobs-alone", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}', "'top_logprobs' needs 'logprobs': true"),
    ("top-logprobs-21", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}', "'top_logprobs'"),
    ("messages-string", "/v1/chat/completions", b'{"messages": "hi"}', "'messages' must be a non-empty list"),
    ("messages-empty", "/v1/chat/completions", b'{"messages": []}', "'messages' must be a non-empty list"),
    ("message-not-object", "/v1/chat/completions", b'{"messages": [1]}', "messages[0]"),
    ("content-number", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "content"),
    ("content-image", "/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "text part"),
    ("role-number", "/v1/chat/completions", b'{"messages": [{"role": 1, "content": "x"}]}', "role"),
]


def test_every_bad_field_is_a_400_with_an_openai_error_body() -> None:
    backend = doubles.SlowBackend(pieces=1, interval=0)
    with serve_in_thread(create_app(backend, "m")) as url:
        for name, path, raw, words in BAD_BODIES:
            response = post(url, None, path, raw=raw)
            assert response.status_code == 400, (name, response.status_code, response.text[:300])
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and words in error["message"], (name, error)
        assert backend.started == []
        unknown = httpx.get(url + "/v1/nothing", timeout=10)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == 404
        assert post(url, {"prompt": "x"}).status_code == 200  # and the server still answers


def test_content_parts_and_max_completion_tokens_are_read() -> None:
    backend = doubles.SlowBackend(pieces=50, interval=0)
    with serve_in_thread(create_app(backend, "m")) as url:
        chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}], "max_completion_tokens": 3}
        answer = post(url, chat, "/v1/chat/completions")
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "xxx"


def test_the_pending_slot_is_given_back_on_every_path() -> None:
    backend = doubles.SlowBackend(pieces=3, interval=0.01)
    with serve_in_thread(create_app(backend, "m", max_pending=2)) as url:
        for _ in range(2):  # the case: two malformed stream requests, then a valid one
            assert post(url, None, raw=b'{"prompt": "x", "stream": true, "stream_options": [1]}').status_code == 400
        assert post(url, {"prompt": "x"}).status_code == 200
    failing = doubles.FailingBackend()
    with serve_in_thread(create_app(failing, "m", max_pending=2)) as url:
        for _ in range(3):  # the model failing, answered and streamed
            assert_openai_error(post(url, {"prompt": "x"}), 500, "the model failed")
            streamed = post(url, {"prompt": "x", "stream": True})
            assert streamed.status_code == 200 and '"server_error"' in streamed.text and "the model broke" not in streamed.text
        failing.complete = doubles.SlowBackend(pieces=2, interval=0).complete
        assert post(url, {"prompt": "x"}).status_code == 200
    slow = doubles.SlowBackend(pieces=1000, interval=0.01)
    with serve_in_thread(create_app(slow, "m", max_pending=2)) as url:
        for _ in range(3):  # clients that hang up, streamed and not
            with httpx.Client(timeout=10) as client, client.stream(
                    "POST", url + "/v1/completions", json={"prompt": "x", "stream": True, "max_tokens": 1000}) as response:
                next(response.iter_lines())
            with pytest.raises(httpx.ReadTimeout):
                post(url, {"prompt": "x", "max_tokens": 1000}, timeout=0.3)
        slow.pieces = 2
        deadline = time.monotonic() + 5
        while (answer := post(url, {"prompt": "x"})).status_code == 429 and time.monotonic() < deadline:
            time.sleep(0.05)  # the last cancelled generation may still be ending its token
        assert answer.status_code == 200


@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "streamed"])
def test_a_client_that_hangs_up_stops_its_generation(streamed: bool) -> None:
    backend = doubles.SlowBackend(pieces=1000, interval=0.01)  # 10 s unless cancelled
    with serve_in_thread(create_app(backend, "m")) as url:
        body = {"prompt": "x", "max_tokens": 1000, "stream": streamed}
        if streamed:
            with httpx.Client(timeout=10) as client, client.stream("POST", url + "/v1/completions", json=body) as response:
                assert next(response.iter_lines()).startswith("data:")
            gone = time.monotonic()
        else:
            with pytest.raises(httpx.ReadTimeout):
                post(url, body, timeout=0.3)
            gone = time.monotonic()
        deadline = gone + 5
        while not backend.cancelled_at and time.monotonic() < deadline:
            time.sleep(0.01)
        assert backend.cancelled_at and backend.cancelled_at[0] - gone < 1.0


def test_stopping_ends_the_generations_in_progress() -> None:
    backend = doubles.SlowBackend(pieces=1000, interval=0.01)
    stopping = threading.Event()
    with serve_in_thread(create_app(backend, "m", stopping=stopping)) as url:
        threading.Timer(0.3, stopping.set).start()
        begun = time.monotonic()
        answer = post(url, {"prompt": "x", "max_tokens": 1000})
        assert answer.status_code == 503 and time.monotonic() - begun < 2
        assert post(url, {"prompt": "x"}).status_code == 503  # nothing new is started


# After its graceful shutdown uvicorn raises the signal again, so the process ends as SIGTERM asked.
STOPPED = (0, -signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_serving(url: str, process: subprocess.Popen[bytes], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            httpx.get(url + "/v1/models", timeout=2)
            return
        except httpx.TransportError:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)


def sigterm_while_generating(command: list[str], port: int) -> tuple[float, int]:
    """Start the server, begin a long streamed generation, SIGTERM it: (seconds to exit, exit status)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process)
        received: list[str] = []

        def listen() -> None:
            try:
                with httpx.Client(timeout=30) as client, client.stream(
                        "POST", url + "/v1/completions",
                        json={"prompt": "def f(x):\n", "max_tokens": 4096, "stream": True, "temperature": 1.0}) as response:
                    received.extend(response.iter_lines())
            except httpx.HTTPError:
                pass

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        deadline = time.monotonic() + 30
        while len(received) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(received) >= 3, "the generation did not start streaming"
        process.send_signal(signal.SIGTERM)
        begun = time.monotonic()
        try:
            status = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return 30.0, -9
        return time.monotonic() - begun, status
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_sigterm_stops_the_server_within_5_seconds_mid_generation() -> None:
    port = free_port()
    seconds, status = sigterm_while_generating([sys.executable, str(DATA / "slow_backend.py"), str(port)], port)
    assert status in STOPPED and seconds < 5, (seconds, status)


@pytest.mark.slow
def test_serve_model_command_limits_and_sigterm(tiny_checkpoint: Path) -> None:
    """The real ``glm5-lsp serve-model`` on a tiny checkpoint: a 1 MB prompt, a too-long one, SIGTERM."""
    port = free_port()
    command = [sys.executable, "-m", "glm5_lsp.cli", "serve-model", "--model", str(tiny_checkpoint), "--port", str(port),
               "--max-prompt-tokens", "64", "--max-pending", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, process)
        begun = time.monotonic()
        assert post(url, {"prompt": "x" * 1_000_000}).status_code == 413
        assert_openai_error(post(url, {"prompt": "def f(a, b):\n    return a + b\n" * 20}), 400, "tokens")
        assert time.monotonic() - begun < 3
        for _ in range(2):
            assert post(url, None, raw=b'{"prompt": "x", "stream": true, "stream_options": [1]}').status_code == 400
        assert post(url, {"prompt": "def f():", "max_tokens": 3}).status_code == 200
    finally:
        process.kill()
        process.wait()
    port = free_port()
    command[command.index("--port") + 1] = str(port)
    seconds, status = sigterm_while_generating(command, port)
    assert status in STOPPED and seconds < 5, (seconds, status)
