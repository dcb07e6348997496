"""``glm5-lsp serve``: argument parsing, and the TCP transport answering ``initialize``."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from glm5_lsp.server import serve_command as cli

REPO = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser


def test_stdio_is_the_default_and_tcp_takes_host_port() -> None:
    assert _parser().parse_args([]).tcp is None
    assert _parser().parse_args(["--tcp", "127.0.0.1:2087"]).tcp == ("127.0.0.1", 2087)
    assert _parser().parse_args(["--tcp", ":2087"]).tcp == ("127.0.0.1", 2087)


@pytest.mark.parametrize("bad", ["2087", "host:", "host:port", "host:70000"])
def test_a_bad_address_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--tcp", bad])
    assert "HOST:PORT" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


_PENDING: dict[int, bytes] = {}  # per connection: bytes read past the last message (the next one's start)


def _read_message(conn: socket.socket) -> dict:
    """The next message on ``conn``; what one read brought of the messages after it is kept for them
    (the server may send a notification and an answer in one segment)."""
    data = _PENDING.pop(conn.fileno(), b"")
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        assert chunk, "the server closed the connection"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in header.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        chunk = conn.recv(4096)
        assert chunk, "the server closed the connection"
        body += chunk
    if body[length:]:
        _PENDING[conn.fileno()] = body[length:]
    return json.loads(body[:length])


def _send(conn: socket.socket, payload: dict) -> None:
    body = json.dumps(payload).encode()
    conn.sendall(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def _serve_tcp(stderr: Path) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """``glm5-lsp serve --tcp`` as a subprocess, and a connection to it."""
    port = _free_port()
    with stderr.open("wb") as err:
        server = subprocess.Popen([sys.executable, "-m", "glm5_lsp.cli", "serve", "--tcp", f"127.0.0.1:{port}"],
                                  env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=err)
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=10)
            _PENDING.pop(conn.fileno(), None)  # a closed connection's leftovers under a reused number
            return server, conn
        except OSError:
            if time.monotonic() >= deadline or server.poll() is not None:
                server.kill()
                raise AssertionError(f"the TCP server never listened: {stderr.read_text(errors='replace')[-2000:]}") from None
            time.sleep(0.1)


def _initialize(conn: socket.socket) -> dict:
    # A served model at a closed port: loading it makes an HTTP client, not a torch runtime.
    _send(conn, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"processId": None, "rootUri": None, "capabilities": {},
                            "initializationOptions": {"model": {"backend": "openai", "url": "http://127.0.0.1:9"}}}})
    reply = _read_message(conn)
    _send(conn, {"jsonrpc": "2.0", "method": "initialized", "params": {}})
    return reply


def _until_answer(conn: socket.socket, msg_id: int) -> dict:
    while True:  # notifications (log messages, progress) may come first
        message = _read_message(conn)
        if message.get("id") == msg_id and "method" not in message:
            return message


def test_tcp_transport_answers_initialize_and_exits_cleanly(tmp_path: Path) -> None:
    """The issue's case: ``exit`` over TCP printed an asyncio ``SystemExit`` traceback. Now the
    process ends with status 0 after ``shutdown`` + ``exit`` and writes no traceback."""
    stderr = tmp_path / "stderr.txt"
    server, conn = _serve_tcp(stderr)
    try:
        with conn:
            capabilities = _initialize(conn)["result"]["capabilities"]
            assert capabilities["textDocumentSync"]["change"] == 2  # incremental
            assert "inlineCompletionProvider" in capabilities
            assert {"glm5.generate", "glm5.fix", "glm5.reindex"} <= set(capabilities["executeCommandProvider"]["commands"])
            _send(conn, {"jsonrpc": "2.0", "id": 2, "method": "shutdown"})
            assert _until_answer(conn, 2)["result"] is None
            _send(conn, {"jsonrpc": "2.0", "method": "exit"})
            assert server.wait(timeout=20) == 0
        errors = stderr.read_text(errors="replace")
        assert "Traceback" not in errors and "SystemExit" not in errors, errors
    finally:
        if server.poll() is None:
            server.kill()


def test_tcp_exit_without_shutdown_is_status_1_and_no_traceback(tmp_path: Path) -> None:
    stderr = tmp_path / "stderr.txt"
    server, conn = _serve_tcp(stderr)
    try:
        with conn:
            _initialize(conn)
            _send(conn, {"jsonrpc": "2.0", "method": "exit"})
            assert server.wait(timeout=20) == 1  # the protocol's rule
        errors = stderr.read_text(errors="replace")
        assert "Traceback" not in errors and "SystemExit" not in errors, errors
    finally:
        if server.poll() is None:
            server.kill()


class _Writer:
    def __init__(self) -> None:
        self.answers: dict[object, dict] = {}

    def write(self, data: bytes) -> None:
        payload = json.loads(data.split(b"\r\n\r\n", 1)[1])
        if "id" in payload and "method" not in payload:
            self.answers[payload["id"]] = payload

    def close(self) -> None:
        pass


def test_exit_right_after_initialized_loads_nothing_and_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """A client that sends ``initialized`` and ``exit`` back to back: the server stops (its model
    worker shut down) before the ``initialized`` handler runs, which then must not start loading
    the model ("cannot schedule new futures after shutdown", seen over TCP in the test above)."""
    import asyncio
    import logging

    from glm5_lsp.server.server import build_server

    async def run() -> None:
        server = build_server()
        writer = _Writer()
        server.protocol.set_writer(writer)
        server.protocol.receive(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "processId": None, "capabilities": {},
            "initializationOptions": {"model": {"backend": "openai", "url": "http://127.0.0.1:9"}}}}).encode())
        while 1 not in writer.answers:
            await asyncio.sleep(0.01)
        server.protocol.receive(json.dumps({"jsonrpc": "2.0", "method": "initialized", "params": {}}).encode())
        server.protocol.receive(json.dumps({"jsonrpc": "2.0", "method": "exit"}).encode())
        server.stop()  # what serving does once exit is read
        await asyncio.sleep(0.3)  # the initialized handler runs now
        assert server.engine.pipeline is None and server.engine.error is None

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
