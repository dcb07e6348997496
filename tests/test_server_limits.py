"""The server bounded by what is open, and on time whatever its model does.

- Six 5 MB documents opened, completed in and closed: the server process's resident memory comes
  back to within 10% of where it was (the issue measured 1.1 -> 2.7 GB). The model is the local
  runtime on a tiny checkpoint, so the decoding monitor, jedi and the context engine all run.
- A completion in a 5 MB document answers within its budget (it reads a window: ``limits.windowChars``;
  the first one in a window parses and checks it afresh and may run on to the answer's hard limit).
- A served model that hangs, answers 500 or 429 (``Retry-After: 5``): the completion answers empty
  within its budget (+100 ms), the next one is not held up behind it, and the user is told once.
"""

from __future__ import annotations

import json
import sys
import sysconfig
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "data" / "server"))
from lsp_raw import RawServer
from scripted_openai import ScriptedOpenAI

from glm5_lsp.server.state import JUDGING_GRACE_S

DATA = Path(__file__).resolve().parent / "data" / "server"
BUDGET_MS = 450  # budgets.completionMs, the default
SLACK_S = 0.1  # the "+100 ms"
FIVE_MB = 5_000_000


def _source() -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_text(encoding="utf-8")


def _big_document(marker: str = "") -> tuple[str, int]:
    """About 5 MB of real Python (argparse.py over and over), with ``marker`` on a line of its own
    near the middle; returns the text and that line's number."""
    source = _source()
    text = (source * (FIVE_MB // len(source) + 1))[:FIVE_MB]
    middle = text.index("\ndef ", len(text) // 2) + 1
    text = text[:middle] + marker + "\n" + text[middle:]
    return text, text.count("\n", 0, middle)


def _inline(uri: str, line: int, character: int) -> dict[str, Any]:
    return {"textDocument": {"uri": uri}, "position": {"line": line, "character": character},
            "context": {"triggerKind": 1}}


def _timed(server: RawServer, method: str, params: dict[str, Any], timeout: float = 60) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    reply = server.call(method, params, timeout=timeout)
    return reply, time.perf_counter() - started


def _warm_checkers(server: RawServer) -> None:
    """A first completion in a small file: the server's first one starts its checkers (a ruff
    server, the compile helper), which is start-up, not what these tests time."""
    uri = "file:///tmp/glm5_limits/warm_checkers.py"
    server.open(uri, "x = 1\nfast = \n")
    server.call("textDocument/inlineCompletion", _inline(uri, 1, 7))
    server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    _settled(server)


def _settled(server: RawServer, quiet_s: float = 1.5) -> None:
    """Until what was sent has been read and the work it started is done (a request answered after it,
    then a quiet moment)."""
    server.call("textDocument/codeAction", {"textDocument": {"uri": "file:///tmp/none.py"},
                                            "range": {"start": {"line": 0, "character": 0},
                                                      "end": {"line": 0, "character": 0}},
                                            "context": {"diagnostics": []}})
    time.sleep(quiet_s)


def test_six_5mb_documents_opened_and_closed_leave_memory_where_it_was(tiny_checkpoint: Path, tmp_path: Path) -> None:
    server = RawServer(stderr_path=tmp_path / "stderr.txt")
    try:
        server.initialize({"model": {"path": str(tiny_checkpoint)}, "completion": {"debounceMs": 0}})
        server.wait_ready(120)
        # The first file of its kind warms what lives for the whole session (jedi's view of the
        # modules it imports, the API-doc index of those packages, the checkers): a real file, once.
        warm = "file:///tmp/glm5_limits/warm.py"
        source = _source()
        server.open(warm, source)
        server.call("textDocument/inlineCompletion", _inline(warm, source.count("\n") // 2, 4))
        server.notify("textDocument/didClose", {"textDocument": {"uri": warm}})
        _settled(server)
        start = server.rss_bytes()
        text, line = _big_document("fast = ")
        peak = start
        for number in range(6):
            uri = f"file:///tmp/glm5_limits/big{number}.py"
            server.open(uri, text)
            for offset in (0, 1):
                reply = server.call("textDocument/inlineCompletion", _inline(uri, line + offset, 4), timeout=60)
                assert "result" in reply, reply
            peak = max(peak, server.rss_bytes())
            server.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        _settled(server)
        end = server.rss_bytes()
        print(f"\nRSS: {start / 2**20:.0f} MiB before, {peak / 2**20:.0f} MiB at most, {end / 2**20:.0f} MiB after "
              f"six 5 MB documents ({end / start:.3f}x)")
        assert end <= 1.10 * start, f"RSS {start / 2**20:.0f} -> {end / 2**20:.0f} MiB"
        assert server.finish() == 0
    finally:
        server.close()


@pytest.fixture(scope="module")
def scripted() -> Any:
    server = ScriptedOpenAI.from_file(DATA / "script.json")
    server.url = server.start()  # type: ignore[attr-defined]
    yield server
    server.stop()


def test_a_completion_in_a_5mb_document_answers_within_its_budget(scripted: Any, tmp_path: Path) -> None:
    server = RawServer(stderr_path=tmp_path / "stderr.txt")
    try:
        server.initialize({"model": {"backend": "openai", "url": scripted.url, "name": "scripted"},
                           "completion": {"debounceMs": 0}})  # budgets.completionMs: the default 450
        server.wait_ready()
        _warm_checkers(server)
        uri = "file:///tmp/glm5_limits/five.py"
        text, line = _big_document("fast = \nfast = ")
        server.open(uri, text)
        _settled(server, quiet_s=0)  # the 5 MB message read (its warm-up may still run): time the request alone
        first, first_s = _timed(server, "textDocument/inlineCompletion", _inline(uri, line, 7))
        # It reads a window (the whole document took 22-37 s): the first one there parses and checks
        # the window afresh, which may run past the budget to the answer's limit.
        assert "result" in first and first_s <= BUDGET_MS / 1000 + JUDGING_GRACE_S + SLACK_S, first_s
        _settled(server)  # what the first one started (the window's parse and summary, its checks) ends
        second, second_s = _timed(server, "textDocument/inlineCompletion", _inline(uri, line + 1, 7))
        print(f"\n5 MB document: first completion {first_s * 1000:.0f} ms, second {second_s * 1000:.0f} ms "
              f"(budget {BUDGET_MS} ms)")
        assert second_s <= BUDGET_MS / 1000 + SLACK_S, f"{second_s * 1000:.0f} ms"
        assert [i["insertText"] for i in second["result"]["items"]] == ["'quick'"]
        assert any("limits.windowChars" in m for m in server.log_lines())
        assert server.finish() == 0
    finally:
        server.close()


class FailingOpenAI:
    """An OpenAI-compatible ``/v1/completions`` whose answer depends on the line being completed:
    ``hang =`` accepts and never answers, ``fail =`` answers 500, ``busy =`` 429 with
    ``Retry-After: 5``, anything else a streamed `` 'quick'``. Other requests (the backend's
    liveness probe, ``GET /``) are answered 501 at once, unless ``silent``: then the server answers
    nothing at all, the issue's "accepts the connection and never answers"."""

    def __init__(self, silent: bool = False) -> None:
        self.requests: list[str] = []
        self.stop_event = threading.Event()
        failing = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                failing.requests.append("GET")
                if silent:
                    failing.stop_event.wait(60)
                    return
                self.send_error(501)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                prompt = str(body.get("prompt", ""))
                before = prompt.split("<|code_suffix|>")[0].rstrip(" ")
                kind = next((k for k in ("hang =", "fail =", "busy =") if before.endswith(k)), "ok")
                failing.requests.append(kind)
                if kind == "hang =":
                    failing.stop_event.wait(60)
                    return
                if kind in ("fail =", "busy ="):
                    data = json.dumps({"error": {"message": f"scripted {kind}"}}).encode()
                    self.send_response(500 if kind == "fail =" else 429)
                    if kind == "busy =":
                        self.send_header("Retry-After", "5")
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if not body.get("stream"):
                    data = json.dumps({"choices": [{"text": " 'quick'", "finish_reason": "stop"}]}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in ({"choices": [{"text": " 'quick'", "finish_reason": None}]},
                              {"choices": [{"text": "", "finish_reason": "stop"}]}, "[DONE]"):
                    line = ("data: " + (event if isinstance(event, str) else json.dumps(event)) + "\n\n").encode()
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def close(self) -> None:
        self.stop_event.set()
        self.http.shutdown()
        self.http.server_close()


@pytest.mark.parametrize("failure", ["hang =", "fail =", "busy ="], ids=["hangs", "500", "429"])
def test_a_failing_served_model_answers_empty_on_time_and_holds_nothing_up(failure: str, tmp_path: Path) -> None:
    fake = FailingOpenAI()
    server = RawServer(stderr_path=tmp_path / "stderr.txt")
    try:
        server.initialize({"model": {"backend": "openai", "url": fake.url, "name": "failing", "timeoutSeconds": 30},
                           "completion": {"debounceMs": 0}}, capabilities={"window": {"showMessage": {}}})
        server.wait_ready()
        uri = "file:///tmp/glm5_limits/failing.py"
        server.open(uri, f"x = 1\n{failure} \nfast = \nfast = \n")
        # The server's first completion starts its checkers (a ruff server, the compile helper): a
        # working one first, so what is timed is the failing model, not the start-up.
        assert "result" in server.call("textDocument/inlineCompletion", _inline(uri, 3, 7))
        _settled(server)
        timings = []
        for _ in range(3):
            reply, seconds = _timed(server, "textDocument/inlineCompletion", _inline(uri, 1, len(failure) + 1))
            # Nothing from the model; a slow one (the hang) is cut, and a model-free suggestion may still come.
            assert "result" in reply and (failure == "hang =" or reply["result"] == {"items": []}), reply
            timings.append(seconds)
        reply, next_s = _timed(server, "textDocument/inlineCompletion", _inline(uri, 2, 7))
        assert "result" in reply, reply  # 'quick', or empty while the server's Retry-After holds calls off
        print(f"\n{failure!r}: {', '.join(f'{t * 1000:.0f}' for t in timings)} ms; the next request {next_s * 1000:.0f} ms")
        assert max(timings) <= BUDGET_MS / 1000 + SLACK_S, timings
        assert next_s <= BUDGET_MS / 1000 + SLACK_S, next_s
        shown = _unavailable_messages(server)
        if failure == "hang =":  # the server answers other prompts and the probe: slow here, not down
            assert shown == [] and "GET" in fake.requests, (shown, fake.requests)
        else:
            assert len(shown) == 1, (failure, shown, server.log_lines()[-6:])  # once for the outage, not per keystroke
            assert any("answered empty" in line for line in server.log_lines())
        assert server.finish() == 0
    finally:
        server.close()
        fake.close()


def _unavailable_messages(server: RawServer) -> list[dict[str, Any]]:
    return [n for n in server.notifications if n.get("method") == "window/showMessage"
            and "unavailable" in n["params"]["message"]]


def test_a_hanging_served_model_is_shown_to_the_user_once(tmp_path: Path) -> None:
    """A model server that accepts connections and never answers anything is down, not merely slow:
    the first silent request has it probed (``GET /``), which it does not answer either, so once the
    probe has waited ``PROBE_TIMEOUT_S`` the circuit opens and the user is told once, with the URL;
    every keystroke meanwhile and after is answered empty within its budget."""
    fake = FailingOpenAI(silent=True)
    server = RawServer(stderr_path=tmp_path / "stderr.txt")
    try:
        server.initialize({"model": {"backend": "openai", "url": fake.url, "name": "failing"},
                           "completion": {"debounceMs": 0}})
        server.wait_ready()
        uri = "file:///tmp/glm5_limits/hanging.py"
        server.open(uri, "x = 1\nhang = \n")
        typed = 0
        begun = time.perf_counter()
        while not _unavailable_messages(server) or typed < 8:  # keystrokes until it is shown, and after
            reply = server.call("textDocument/inlineCompletion", _inline(uri, 1, 7 - typed % 2))
            assert "result" in reply, reply  # nothing from the model (a model-free suggestion may still come)
            typed += 1
            assert time.perf_counter() - begun < 10, server.log_lines()[-6:]
        shown = _unavailable_messages(server)
        assert len(shown) == 1, shown  # once, not per keystroke
        message = shown[0]["params"]["message"]
        assert fake.url in message and "nor to a liveness probe" in message, message
        assert server.finish() == 0
    finally:
        server.close()
        fake.close()


class _Writer:
    """Collects what an in-process server sends."""

    def __init__(self) -> None:
        self.answers: dict[Any, dict[str, Any]] = {}

    def write(self, data: bytes) -> None:
        payload = json.loads(data.split(b"\r\n\r\n", 1)[1])
        if "id" in payload and "method" not in payload:
            self.answers[payload["id"]] = payload

    def close(self) -> None:
        pass


def test_a_closed_document_leaves_nothing_behind(scripted: Any) -> None:
    """Everything kept per document goes with didClose: the workspace's copy, the context engine's
    document and summary, jedi's parse, the suggestion shown, the warm-up, the running jobs."""
    import asyncio

    import jedi
    import parso.cache

    from glm5_lsp.server.server import build_server

    async def run() -> None:
        server = build_server()
        writer = _Writer()
        server.protocol.set_writer(writer)

        async def call(msg_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
            server.protocol.receive(json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method,
                                                "params": params}).encode())
            while msg_id not in writer.answers:
                await asyncio.sleep(0.01)
            return writer.answers[msg_id]

        def notify(method: str, params: dict[str, Any]) -> None:
            server.protocol.receive(json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode())

        await call(1, "initialize", {"processId": None, "capabilities": {}, "initializationOptions": {
            "model": {"backend": "openai", "url": scripted.url, "name": "scripted"}, "completion": {"debounceMs": 0},
            "budgets": {"completionMs": 20000, "requestTimeoutMs": 20000}}})
        notify("initialized", {})
        while server.engine.pipeline is None:
            await asyncio.sleep(0.05)
        uri, path = "file:///tmp/glm5_limits/closed.py", "/tmp/glm5_limits/closed.py"
        notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                         "text": "x = 1\nfast = \n"}})
        reply = await call(2, "textDocument/inlineCompletion", _inline(uri, 1, 7))
        assert [i["insertText"] for i in reply["result"]["items"]] == ["'quick'"]
        await asyncio.to_thread(jedi.Script("x = 1\n", path=path).get_names)  # what the decoding monitor leaves
        context = server.engine.context
        assert context is not None and context.engine.documents.get(path) is not None
        while server._warm_tasks:
            await asyncio.sleep(0.05)
        notify("textDocument/didClose", {"textDocument": {"uri": uri}})
        await asyncio.sleep(0.5)  # the release runs off the event loop
        assert server.document(uri) is None
        assert context.engine.documents.get(path) is None and path not in context.engine.symbols.files
        assert not any(Path(path) in cached or path in cached for cached in parso.cache.parser_cache.values())
        assert not server.typed_through._shown and not server.supersession.busy()
        assert not server._warm_tasks and not server._diagnose_tasks
        server.stop()

    asyncio.run(run())


def test_an_opened_document_s_style_is_read_before_its_first_completion(scripted: Any) -> None:
    """didOpen reads what the repair loop takes from the whole file (its style), off the requests."""
    import asyncio


    async def run() -> None:
        server, send = await _initialized(scripted.url)
        while server.engine.pipeline is None:
            await asyncio.sleep(0.05)
        path = "/tmp/glm5_limits/styled.py"
        text = "".join(f"def read_part_{i}(a):\n    return 'x'  # part\n" for i in range(6))
        send({"method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": "file://" + path, "languageId": "python", "version": 1, "text": text}}})
        await asyncio.sleep(0.1)
        while server._warm_tasks:
            await asyncio.sleep(0.05)
        (rewrite, *_) = server.engine.pipeline.repair.rewriters
        kept = rewrite.__self__._by_path.get((path, "python"))
        assert kept is not None and kept[1].quote == "'" and kept[1].naming.get("function") == "snake"
        server.stop()

    asyncio.run(run())


def test_a_document_opened_while_the_model_loads_is_warmed_once_it_is_loaded(scripted: Any, monkeypatch) -> None:
    """An editor opens its files as the server starts, seconds before the model is loaded: what
    their warm-up reads through the pipeline (the file's style, its checks) is read when the load
    ends, not in the first completion (about 120 ms of it)."""
    import asyncio
    import time

    from glm5_lsp.server import loader

    load = loader.Engine.load
    monkeypatch.setattr(loader.Engine, "load", lambda engine, progress=None: (time.sleep(0.5), load(engine, progress)))

    async def run() -> None:
        server, send = await _initialized(scripted.url)
        path = "/tmp/glm5_limits/early.py"
        text = "".join(f"def read_part_{i}(a):\n    return 'x'  # part\n" for i in range(6))
        send({"method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": "file://" + path, "languageId": "python", "version": 1, "text": text}}})
        await asyncio.sleep(0.1)
        assert server.engine.pipeline is None  # still loading
        while server.engine.pipeline is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
        while server._warm_tasks:
            await asyncio.sleep(0.05)
        (rewrite, *_) = server.engine.pipeline.repair.rewriters
        kept = rewrite.__self__._by_path.get((path, "python"))
        assert kept is not None and kept[1].quote == "'"
        server.stop()

    asyncio.run(run())


async def _initialized(url: str) -> tuple[Any, Any]:
    """A server on a served (scripted) model, initialized; and a function that sends it a message."""
    import asyncio

    from glm5_lsp.server.server import build_server

    server = build_server()
    writer = _Writer()
    server.protocol.set_writer(writer)

    def send(payload: dict[str, Any]) -> None:
        server.protocol.receive(json.dumps({"jsonrpc": "2.0", **payload}).encode())

    send({"id": 1, "method": "initialize", "params": {"processId": None, "capabilities": {}, "initializationOptions": {
        "model": {"backend": "openai", "url": url, "name": "scripted"}}}})
    while 1 not in writer.answers:
        await asyncio.sleep(0.01)
    send({"method": "initialized", "params": {}})
    return server, send
