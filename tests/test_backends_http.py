"""The OpenAI-compatible HTTP backend and ``serve-model`` over loopback.

``serve-model``'s app serves a scripted backend here (``tests/data/batch/scripted_backend.py``):
what is under test is the HTTP layer (the official ``openai`` client and our ``OpenAIHTTPBackend``,
streaming, 401, 429 retries, 4xx errors). ``test_backends_local.py`` serves a real checkpoint.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from glm5_lsp.backends.base import BackendError, BackendUnavailable, Completion, CompletionRequest
from glm5_lsp.backends.factory import create_backend
from glm5_lsp.backends.openai_http import CircuitBreaker, OpenAIHTTPBackend, strip_fences
from glm5_lsp.serve_model import create_app, serve_in_thread, split_fim
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


# ---- deadlines, cancellation and the circuit breaker (issue 19) -------------------------------


@pytest.fixture()
def hanging() -> Iterator[tuple[str, list[socket.socket]]]:
    """A server that accepts every connection, reads the request and never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(connection)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", held
    stop.set()
    thread.join(timeout=5)
    for connection in held:
        connection.close()
    listener.close()


def timed(call: Callable[[], object]) -> tuple[float, object]:
    """``(seconds, result or the exception raised)``."""
    begun = time.monotonic()
    try:
        outcome: object = call()
    except Exception as error:  # noqa: BLE001 - the test looks at it
        outcome = error
    return time.monotonic() - begun, outcome


SLACK = 0.1  # the acceptance's margin past a deadline


@pytest.mark.parametrize("streaming", [False, True], ids=["plain", "streamed"])
def test_a_hanging_server_fails_by_the_deadline_and_holds_no_one_up(
        hanging: tuple[str, list[socket.socket]], streaming: bool) -> None:
    url, held = hanging
    http = OpenAIHTTPBackend(url, "m", timeout=0.5, breaker_failures=10)
    extra = {"on_text": lambda piece: None} if streaming else {}
    results: list[tuple[float, object]] = []
    first = threading.Thread(target=lambda: results.append(timed(lambda: http.complete(
        CompletionRequest(Prompt("a"), **extra)))))
    first.start()
    time.sleep(0.2)  # the second request starts while the first is waiting
    second = timed(lambda: http.complete(CompletionRequest(Prompt("b"), deadline=time.monotonic() + 0.3, **extra)))
    first.join()
    (seconds, outcome), = results
    assert isinstance(outcome, BackendUnavailable) and "no answer in 0.5" in str(outcome)
    assert "backend's deadline" in str(outcome) and 0.5 <= seconds < 0.5 + SLACK
    # Its own (shorter) deadline: cut, as a server only slower than the budget would be; the
    # liveness probe the first one started has not concluded yet.
    assert isinstance(second[1], Completion) and second[1].finish_reason == "cancelled"
    assert 0.3 <= second[0] < 0.3 + SLACK
    assert len(held) == 3  # the two requests and the probe (GET /)
    http.close()


def test_cancellation_is_seen_while_waiting_for_an_answer(hanging: tuple[str, list[socket.socket]]) -> None:
    url, _ = hanging
    http = OpenAIHTTPBackend(url, "m", timeout=30)
    http.load()
    cancel_at = time.monotonic() + 0.2
    seconds, done = timed(lambda: http.complete(CompletionRequest(Prompt("a"),
                                                                  should_cancel=lambda: time.monotonic() >= cancel_at)))
    assert isinstance(done, Completion) and done.finish_reason == "cancelled" and done.text == ""
    assert seconds < 0.2 + SLACK


@pytest.fixture()
def unreachable() -> Iterator[str]:
    """A port whose accept queue is full and never drained: a new connect() hangs in the handshake."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filling = []
    for _ in range(3):
        client = socket.socket()
        client.setblocking(False)
        try:
            client.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        filling.append(client)
    time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    for client in filling:
        client.close()
    listener.close()


def test_cancellation_is_seen_while_connecting(unreachable: str) -> None:
    http = OpenAIHTTPBackend(unreachable, "m", timeout=30)
    http.load()
    cancel_at = time.monotonic() + 0.2
    seconds, done = timed(lambda: http.complete(CompletionRequest(Prompt("a"),
                                                                  should_cancel=lambda: time.monotonic() >= cancel_at)))
    assert isinstance(done, Completion) and done.finish_reason == "cancelled" and seconds < 0.2 + SLACK
    seconds, outcome = timed(lambda: http.complete(CompletionRequest(Prompt("a"), deadline=time.monotonic() + 0.3)))
    assert isinstance(outcome, Completion) and outcome.finish_reason == "cancelled"  # and the deadline while connecting
    assert seconds < 0.3 + SLACK
    assert wait_until(lambda: http.breaker.state == "open", 2.0)  # the probe could not connect either
    seconds, outcome = timed(lambda: http.complete(CompletionRequest(Prompt("a"), deadline=time.monotonic() + 0.3)))
    assert isinstance(outcome, BackendUnavailable) and "circuit open" in str(outcome) and seconds < SLACK
    http.close()


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def counting_app(status: int, headers: dict[str, str] | None = None) -> tuple[Starlette, list[float], list[int]]:
    """Answers ``status`` (changeable through the returned list) to every request; records arrivals."""
    arrivals: list[float] = []
    current = [status]

    async def completions(request: Request) -> JSONResponse:
        arrivals.append(time.monotonic())
        if current[0] != 200:
            return JSONResponse({"error": {"message": "not now"}}, status_code=current[0], headers=headers)
        return JSONResponse({"choices": [{"text": "ok", "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])]), arrivals, current


def test_a_500_is_retried_only_within_the_deadline() -> None:
    app, arrivals, _ = counting_app(500)
    with serve_in_thread(app) as url:
        http = OpenAIHTTPBackend(url, "m", timeout=1.0, backoff=0.2, max_retries=10, breaker_failures=10)
        seconds, outcome = timed(lambda: http.complete(CompletionRequest(Prompt("x"), on_text=lambda p: None)))
        assert isinstance(outcome, BackendUnavailable) and "HTTP 500" in str(outcome)
        assert seconds < 1.0 + SLACK and len(arrivals) >= 2  # retried, and gave up before a wait past the deadline
        http.close()


def test_a_429_retry_after_past_the_deadline_fails_at_once_and_holds_later_requests_off() -> None:
    app, arrivals, _ = counting_app(429, headers={"Retry-After": "5"})
    with serve_in_thread(app) as url:
        http = OpenAIHTTPBackend(url, "m", timeout=1.0)
        http.load()
        seconds, outcome = timed(lambda: http.complete(CompletionRequest(Prompt("x"))))
        assert isinstance(outcome, BackendUnavailable) and "HTTP 429" in str(outcome) and seconds < SLACK + 0.2
        again, outcome = timed(lambda: http.complete(CompletionRequest(Prompt("y"))))
        assert isinstance(outcome, BackendUnavailable) and "Retry-After" in str(outcome) and again < SLACK
        assert len(arrivals) == 1  # the second request did not ask a server that said to wait 5 s
        http.close()


def test_a_retry_after_holds_off_other_requests_even_when_the_first_is_cancelled() -> None:
    app, arrivals, _ = counting_app(429, headers={"Retry-After": "5"})
    with serve_in_thread(app) as url:
        http = OpenAIHTTPBackend(url, "m", timeout=30)  # the deadline comes only through should_cancel
        http.load()
        cancel_at = time.monotonic() + 0.3
        seconds, done = timed(lambda: http.complete(CompletionRequest(
            Prompt("x"), should_cancel=lambda: time.monotonic() >= cancel_at)))
        assert isinstance(done, Completion) and done.finish_reason == "cancelled" and seconds < 0.3 + SLACK
        again, outcome = timed(lambda: http.complete(CompletionRequest(Prompt("y"), should_cancel=lambda: False)))
        assert isinstance(outcome, BackendUnavailable) and "Retry-After" in str(outcome) and again < SLACK
        assert len(arrivals) == 1
        http.close()


def test_a_server_that_ignores_stream_still_answers() -> None:
    app, _, _ = counting_app(200)  # plain JSON whatever the request asks
    with serve_in_thread(app) as url:
        pieces: list[str] = []
        done = OpenAIHTTPBackend(url, "m").complete(CompletionRequest(Prompt("x"), on_text=pieces.append))
        assert done.text == "ok" and pieces == ["ok"] and done.completion_tokens == 1


def test_a_backoff_sleep_ends_when_the_request_is_cancelled() -> None:
    app, arrivals, _ = counting_app(503, headers={"Retry-After": "3"})
    with serve_in_thread(app) as url:
        http = OpenAIHTTPBackend(url, "m", timeout=30)
        http.load()
        cancel_at = time.monotonic() + 0.4
        seconds, done = timed(lambda: http.complete(CompletionRequest(
            Prompt("x"), should_cancel=lambda: time.monotonic() >= cancel_at)))
        assert isinstance(done, Completion) and done.finish_reason == "cancelled"
        assert seconds < 0.4 + SLACK and len(arrivals) == 1
        http.close()


def test_the_circuit_opens_fails_fast_then_probes_and_closes() -> None:
    app, arrivals, status = counting_app(500)
    with serve_in_thread(app) as url:
        http = OpenAIHTTPBackend(url, "m", max_retries=0, breaker_failures=2, breaker_cooldown_s=0.5)
        for _ in range(2):
            with pytest.raises(BackendUnavailable, match="HTTP 500"):
                http.complete(CompletionRequest(Prompt("x")))
        seconds, outcome = timed(lambda: http.complete(CompletionRequest(Prompt("x"))))
        assert isinstance(outcome, BackendUnavailable) and "circuit open" in str(outcome) and seconds < 0.05
        assert len(arrivals) == 2  # failing fast: the server was not asked
        time.sleep(0.55)
        with pytest.raises(BackendUnavailable, match="HTTP 500"):  # the probe fails: open again, for longer
            http.complete(CompletionRequest(Prompt("x")))
        assert len(arrivals) == 3 and http.breaker.state == "open"
        status[0] = 200
        time.sleep(0.55)
        with pytest.raises(BackendUnavailable, match="circuit open"):  # the cool-down doubled to 1 s
            http.complete(CompletionRequest(Prompt("x")))
        time.sleep(0.5)
        assert http.complete(CompletionRequest(Prompt("x"))).text == "ok"  # the probe succeeds: closed
        assert http.complete(CompletionRequest(Prompt("x"))).text == "ok" and http.breaker.state == "closed"
        http.close()


def test_the_half_open_circuit_lets_one_probe_through_at_a_time() -> None:
    now = [0.0]
    breaker = CircuitBreaker(failures=1, cooldown_s=1.0, clock=lambda: now[0])
    assert breaker.admit() == (False, None)  # closed: allowed, no probe
    assert breaker.failed("boom") and breaker.state == "open"
    assert breaker.admit()[1] is not None
    now[0] = 1.0
    assert breaker.admit() == (True, None)  # the probe
    assert "probing" in (breaker.admit()[1] or "")
    breaker.release(True)  # cancelled, no verdict: the next call probes instead
    assert breaker.admit() == (True, None)
    breaker.succeeded()
    assert breaker.state == "closed" and breaker.admit() == (False, None)


def test_a_dead_server_is_unavailable_not_an_error() -> None:
    seconds, outcome = timed(lambda: OpenAIHTTPBackend("http://127.0.0.1:9", "m", max_retries=5, backoff=0.05,
                                                       breaker_failures=3).complete(CompletionRequest(Prompt("x"))))
    assert isinstance(outcome, BackendUnavailable) and "ConnectError" in str(outcome) and seconds < 2


def test_a_completion_on_a_hanging_server_is_unavailable_within_its_budget(
        hanging: tuple[str, list[socket.socket]]) -> None:
    """The pipeline's time budget reaches the backend (through should_cancel and the request's
    deadline): the issue's 124 s freeze. A server that answers nothing at all, not even the
    liveness probe the first silent request starts, is down: once the probe has waited
    ``PROBE_TIMEOUT_S`` the circuit opens, the request waiting then raises ``BackendUnavailable``
    with the URL (the language server answers that empty and tells the user once), and later
    keystrokes fail at once without asking the server. Until then each answers empty by its budget."""
    from glm5_lsp.backends.http_stream import PROBE_TIMEOUT_S
    from glm5_lsp.pipeline import Pipeline, PipelineSettings

    url, held = hanging
    settings = PipelineSettings()
    settings.repair.time_budget_s = 0.45  # the server's completion budget
    backend = OpenAIHTTPBackend(url, "m", timeout=30)
    pipeline = Pipeline(backend, settings)
    document = "import os\n\ndef f(x):\n    return os.path.jo"
    pipeline.complete(document, len(document))  # the checkers' first start is not what is measured
    outcomes = []
    begun = time.monotonic()
    while not outcomes or not isinstance(outcomes[-1][1], Exception):  # keystrokes until it is shown
        seconds, outcome = timed(lambda: pipeline.complete(document, len(document)))
        outcomes.append((seconds, outcome))
        assert seconds < 0.45 + SLACK, outcomes  # and the next request is not held up behind the last
        assert time.monotonic() - begun < PROBE_TIMEOUT_S + 1.5, outcomes
    *quiet, (_, down) = outcomes
    assert all(o.text == "" and not o.clean for _, o in quiet), quiet
    assert isinstance(down, BackendUnavailable) and url in str(down), down
    assert "nor to a liveness probe (GET /) in 1s" in str(down) and backend.breaker.state == "open"
    asked = len(held)
    seconds, outcome = timed(lambda: pipeline.complete(document, len(document)))
    assert isinstance(outcome, BackendUnavailable) and "circuit open" in str(outcome) and seconds < 0.45 / 2
    seconds, outcome = timed(lambda: backend.complete(CompletionRequest(Prompt("x"))))
    assert isinstance(outcome, BackendUnavailable) and "circuit open" in str(outcome) and seconds < SLACK
    assert "nor to a liveness probe" in str(outcome)  # a refusal says why the circuit opened
    assert len(held) == asked  # failing fast: the server was not asked again
    backend.close()


def test_the_callers_cancellation_is_not_an_outage(hanging: tuple[str, list[socket.socket]]) -> None:
    """A newer keystroke cancelling is the caller's doing, and the request's own deadline passing
    (also when ``should_cancel`` reports it first, as the repair loop folds it in) only says the
    server is slower than the budget: both are ``cancelled`` and count nothing. What opens the
    circuit is the liveness probe: this server does not answer it either."""
    url, held = hanging
    http = OpenAIHTTPBackend(url, "m", timeout=30)
    http.load()
    now = time.monotonic()
    done = http.complete(CompletionRequest(Prompt("a"), should_cancel=lambda: time.monotonic() >= now + 0.05,
                                           deadline=now + 5))
    assert done.finish_reason == "cancelled" and http.breaker.consecutive == 0 and len(held) == 1  # no probe yet
    now = time.monotonic()
    seconds, outcome = timed(lambda: http.complete(CompletionRequest(
        Prompt("a"), should_cancel=lambda: time.monotonic() >= now + 0.3, deadline=now + 0.3)))
    assert isinstance(outcome, Completion) and outcome.finish_reason == "cancelled", outcome
    assert seconds < 0.3 + SLACK and http.breaker.state == "closed"
    assert wait_until(lambda: http.breaker.state == "open", 2.0) and not http.liveness.alive
    http.close()


def test_a_server_that_sends_nothing_until_its_first_token_is_only_slow() -> None:
    """Ollama loading a model, or a llama.cpp whose slot is busy, sends not even headers until the
    first token: past the caller's budget that is ``cancelled`` (empty) and the server is not
    counted as down, because it answers the liveness probe; a request with time enough gets the text."""
    import asyncio

    async def completions(request: Request) -> JSONResponse:
        await asyncio.sleep(0.6)  # "loading the model"
        return JSONResponse({"choices": [{"text": "late", "finish_reason": "stop"}]})

    async def root(request: Request) -> JSONResponse:
        return JSONResponse({"detail": "Not Found"}, status_code=404)  # any answer: the server is up

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/", root)])
    with serve_in_thread(app) as url:
        http = OpenAIHTTPBackend(url, "m", timeout=30, breaker_failures=1)
        http.load()
        for _ in range(3):
            until = time.monotonic() + 0.3
            seconds, done = timed(lambda: http.complete(CompletionRequest(
                Prompt("x"), should_cancel=lambda: time.monotonic() >= until, deadline=until)))  # noqa: B023
            assert isinstance(done, Completion) and done.finish_reason == "cancelled" and seconds < 0.3 + SLACK
        assert http.liveness is not None and http.liveness.alive and http.breaker.state == "closed"
        assert http.complete(CompletionRequest(Prompt("x"), on_text=lambda piece: None)).text == "late"
        http.close()


def test_a_slow_server_that_answered_is_not_an_outage() -> None:
    """Headers at once, text later than the caller's budget (a big model's prefill): the request is
    cut (``cancelled``, empty), the server is not counted as failing, the next request with time
    enough gets the text."""
    import asyncio

    from starlette.responses import StreamingResponse

    async def completions(request: Request) -> StreamingResponse:
        async def events() -> object:
            yield b": warming\n\n"
            await asyncio.sleep(0.6)
            yield b'data: {"choices": [{"text": "late", "finish_reason": "stop"}]}\n\n'
            yield b"data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
    with serve_in_thread(app) as url:
        http = OpenAIHTTPBackend(url, "m", timeout=30, breaker_failures=1)
        http.load()
        for _ in range(2):
            until = time.monotonic() + 0.3
            done = http.complete(CompletionRequest(Prompt("x"), should_cancel=lambda: time.monotonic() >= until,  # noqa: B023
                                                   deadline=until))
            assert done.finish_reason == "cancelled" and done.text == "" and http.breaker.state == "closed"
        assert http.complete(CompletionRequest(Prompt("x"), on_text=lambda piece: None)).text == "late"
        http.close()
