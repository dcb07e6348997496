"""The OpenAI-compatible HTTP backend and ``serve-model`` over loopback.

``serve-model``'s app serves a scripted backend here (``tests/data/batch/scripted_backend.py``):
what is under test is the HTTP layer (the official ``openai`` client and our ``OpenAIHTTPBackend``,
streaming, 401, 429 retries, 4xx errors). ``test_backends_local.py`` serves a real checkpoint.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from glm5_lsp.backends.base import BackendError, CompletionRequest
from glm5_lsp.backends.factory import create_backend
from glm5_lsp.backends.openai_http import OpenAIHTTPBackend, strip_fences
from glm5_lsp.backends.serve_model import create_app, serve_in_thread, split_fim
from glm5_lsp.spans import Prompt, Span

_spec = importlib.util.spec_from_file_location(
    "scripted_backend", Path(__file__).parent / "data" / "batch" / "scripted_backend.py")
assert _spec and _spec.loader
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)

KEY = "test-key-5d1c"


def reply(request: CompletionRequest) -> str:
    prompt = request.prompt
    return f"[{prompt.prefix[-5:]}|{prompt.suffix[:5]}] pieces and more text\nsecond line"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, scripted.ScriptedBackend]]:
    backend = scripted.ScriptedBackend(reply)
    with serve_in_thread(create_app(backend, "glm5-test", api_key=KEY, default_max_tokens=32)) as url:
        yield url, backend


@pytest.fixture()
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLM5_TEST_KEY", KEY)


def test_openai_client_completions_chat_models_and_streaming(server: tuple[str, object]) -> None:
    url, _ = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    assert [model.id for model in client.models.list()] == ["glm5-test"]
    done = client.completions.create(model="glm5-test", prompt="def f():", max_tokens=8)
    assert done.choices[0].text.startswith("[ f():|]") and done.usage.total_tokens > 0
    chat = client.chat.completions.create(model="glm5-test", messages=[{"role": "user", "content": "hello"}])
    assert chat.choices[0].message.content.startswith("[ello\n|]") and chat.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].text for c in client.completions.create(model="glm5-test", prompt="abc", stream=True) if c.choices]
    assert len(pieces) > 3 and "".join(pieces) == reply(CompletionRequest(Prompt("abc")))
    chunks = list(client.chat.completions.create(model="glm5-test", messages=[{"role": "user", "content": "x"}],
                                                 stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply(CompletionRequest(Prompt("x\n"))) and chunks[-1].usage.completion_tokens > 0


def test_openai_client_401_and_400(server: tuple[str, object]) -> None:
    url, _ = server
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="glm5-test", prompt="x", temperature=9)


def test_http_backend_completes_streams_and_sends_fim(server: tuple[str, scripted.ScriptedBackend], key: None) -> None:
    url, backend = server
    http = OpenAIHTTPBackend(url, "glm5-test", api_key_env="GLM5_TEST_KEY")
    done = http.complete(CompletionRequest(Prompt("x = f("), max_tokens=8, stop=["\n"]))
    assert done.text == "[ = f(|] pieces and more text" and done.finish_reason == "stop"
    pieces: list[str] = []
    streamed = http.complete(CompletionRequest(Prompt("def g(", "):\n    pass\n"), on_text=pieces.append))
    assert len(pieces) > 3 and "".join(pieces) == streamed.text and streamed.completion_tokens > 0
    sent = backend.requests[-1].prompt
    assert (sent.prefix, sent.suffix) == ("def g(", "):\n    pass\n")  # FIM tokens split back into parts
    cancelled = http.complete(CompletionRequest(Prompt("abc"), on_text=pieces.append, should_cancel=lambda: bool(pieces)))
    assert cancelled.finish_reason == "cancelled"


def test_http_backend_chat_mode(server: tuple[str, object], key: None) -> None:
    url, _ = server
    http = create_backend("openai", base_url=url + "/v1", model="glm5-test", api_key_env="GLM5_TEST_KEY", chat=True)
    assert "pieces and more text" in http.complete(CompletionRequest(Prompt("print("))).text


def test_http_backend_reports_401_without_leaking_the_key(server: tuple[str, object],
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    url, _ = server
    monkeypatch.setenv("GLM5_TEST_KEY", "wrong-secret-9f")
    http = OpenAIHTTPBackend(url, "glm5-test", api_key_env="GLM5_TEST_KEY", max_retries=2)
    with caplog.at_level(logging.DEBUG), pytest.raises(BackendError, match=r"401.*\$GLM5_TEST_KEY is missing or wrong") as raised:
        http.complete(CompletionRequest(Prompt("x")))
    assert "wrong-secret-9f" not in str(raised.value) and "wrong-secret-9f" not in caplog.text
    monkeypatch.delenv("GLM5_TEST_KEY")
    with pytest.raises(BackendError, match="401"):
        http.complete(CompletionRequest(Prompt("x")))


def test_http_backend_reports_other_4xx(server: tuple[str, object], key: None) -> None:
    url, _ = server
    http = OpenAIHTTPBackend(url, "glm5-test", api_key_env="GLM5_TEST_KEY")
    with pytest.raises(BackendError, match="400.*top_p"):
        http.complete(CompletionRequest(Prompt("x"), top_p=3.0))


def test_runtime_only_features_degrade_with_one_log_line(server: tuple[str, object], key: None,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    url, _ = server
    http = OpenAIHTTPBackend(url, "glm5-test", api_key_env="GLM5_TEST_KEY")
    request = CompletionRequest(Prompt("abc", spans=[Span(0, 3, "api_doc")]), logits_processor=lambda ids, logits: logits)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert http.complete(request).text
    assert caplog.text.count("attention policy") == 1 and caplog.text.count("logits processor") == 1


def flaky_app(failures: list[int], retry_after: str | None) -> tuple[Starlette, list[float]]:
    """Answers each status in ``failures`` once, then a normal completion; records arrival times."""
    arrivals: list[float] = []

    async def completions(request: Request) -> JSONResponse:
        arrivals.append(time.monotonic())
        if len(arrivals) <= len(failures):
            headers = {"Retry-After": retry_after} if retry_after is not None else None
            return JSONResponse({"error": {"message": "slow down"}}, status_code=failures[len(arrivals) - 1], headers=headers)
        return JSONResponse({"choices": [{"text": "ok", "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])]), arrivals


def test_429_is_retried_honouring_retry_after() -> None:
    app, arrivals = flaky_app([429], retry_after="0.3")
    with serve_in_thread(app) as url:
        done = OpenAIHTTPBackend(url, "m", backoff=5.0).complete(CompletionRequest(Prompt("x")))
    assert done.text == "ok" and len(arrivals) == 2
    assert 0.25 <= arrivals[1] - arrivals[0] < 3  # waited Retry-After, not the 5 s backoff


def test_5xx_backs_off_exponentially_then_gives_up() -> None:
    app, arrivals = flaky_app([503, 500], retry_after=None)
    with serve_in_thread(app) as url:
        assert OpenAIHTTPBackend(url, "m", backoff=0.2).complete(CompletionRequest(Prompt("x"))).text == "ok"
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert len(arrivals) == 3 and gaps[0] >= 0.2 and gaps[1] >= 0.4  # 0.2 s, then 0.4 s
    app, arrivals = flaky_app([503] * 5, retry_after="0")
    with serve_in_thread(app) as url, pytest.raises(BackendError, match="giving up after 3 attempts.*503"):
        OpenAIHTTPBackend(url, "m", max_retries=2).complete(CompletionRequest(Prompt("x")))


def test_connection_refused_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="giving up"):
        OpenAIHTTPBackend("http://127.0.0.1:9", "m", max_retries=1, backoff=0.01).complete(CompletionRequest(Prompt("x")))


def test_serve_model_answers_429_when_busy_and_the_backend_retries_it() -> None:
    backend = scripted.ScriptedBackend("slow answer", delay=0.6)
    with serve_in_thread(create_app(backend, "m", max_pending=1)) as url:
        first: list[str] = []
        thread = threading.Thread(target=lambda: first.append(
            OpenAIHTTPBackend(url, "m").complete(CompletionRequest(Prompt("a"))).text))
        thread.start()
        time.sleep(0.2)
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0).completions.create(model="m", prompt="b")
        second = OpenAIHTTPBackend(url, "m", backoff=0.2).complete(CompletionRequest(Prompt("c")))
        thread.join()
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        for _ in range(2):  # each finished request, streamed or not, gives its place back
            assert "".join(c.choices[0].text for c in client.completions.create(model="m", prompt="d", stream=True))
            assert client.completions.create(model="m", prompt="e").choices[0].text == "slow answer"
    assert first == ["slow answer"] and second.text == "slow answer"


def test_fim_prompt_parsing_and_fence_stripping() -> None:
    prompt = split_fim("<|code_prefix|>a = (<|code_suffix|>)\n<|code_middle|>", None)
    assert (prompt.prefix, prompt.suffix) == ("a = (", ")\n")
    assert split_fim("plain", "tail").suffix == "tail" and split_fim("plain", None).suffix == ""
    assert strip_fences("```python\nx = 1\n```") == "x = 1" and strip_fences("x = 1") == "x = 1"
