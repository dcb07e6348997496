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


def _read_message(conn: socket.socket) -> dict:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        assert chunk, "the server closed the connection"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in header.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += conn.recv(4096)
    return json.loads(body[:length])


def _send(conn: socket.socket, payload: dict) -> None:
    body = json.dumps(payload).encode()
    conn.sendall(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)


def test_tcp_transport_answers_initialize() -> None:
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "glm5_lsp.cli", "serve", "--tcp", f"127.0.0.1:{port}"],
                              env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port), timeout=10)
                break
            except OSError:
                assert time.monotonic() < deadline, "the TCP server never listened"
                time.sleep(0.1)
        with conn:
            _send(conn, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"processId": None, "rootUri": None, "capabilities": {}}})
            reply = _read_message(conn)
            capabilities = reply["result"]["capabilities"]
            assert capabilities["textDocumentSync"]["change"] == 2  # incremental
            assert "inlineCompletionProvider" in capabilities
            assert capabilities["executeCommandProvider"]["commands"] == ["glm5.generate", "glm5.fix", "glm5.reindex"]
            _send(conn, {"jsonrpc": "2.0", "id": 2, "method": "shutdown"})
            assert _read_message(conn)["id"] == 2
            _send(conn, {"jsonrpc": "2.0", "method": "exit"})
        server.wait(timeout=20)
    finally:
        if server.poll() is None:
            server.kill()
