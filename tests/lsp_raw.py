"""A raw LSP client for tests: the real ``glm5-lsp serve`` as a subprocess, spoken to in bytes.

pytest-lsp frames every message correctly; the fuzzer and the lifecycle tests need to send bytes
that are not messages at all. :class:`RawServer` writes whatever it is given to the server's stdin
and reads its stdout strictly (a malformed frame from the server fails the test), collecting
responses by id, responses with ``"id": null`` and notifications.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "server"


def frame(body: bytes | str, length: int | None = None, name: str = "Content-Length") -> bytes:
    data = body.encode("utf-8") if isinstance(body, str) else body
    size = len(data) if length is None else length
    return f"{name}: {size}\r\n\r\n".encode("ascii") + data


def message(payload: Any) -> bytes:
    return frame(json.dumps(payload))


class RawServer:
    """``glm5-lsp serve`` on stdio, with a strict reader of what it sends."""

    def __init__(self, args: tuple[str, ...] = (), env: dict[str, str] | None = None, stderr_path: Path | None = None):
        self.stderr_path = stderr_path
        stderr = open(stderr_path, "wb") if stderr_path is not None else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "glm5_lsp.cli", "serve", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=stderr, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        )
        if stderr is not subprocess.DEVNULL:
            stderr.close()
        self.responses: dict[Any, list[dict[str, Any]]] = {}
        self.null_errors: list[dict[str, Any]] = []
        self.notifications: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []  # the server's own requests to us (answered null)
        self.protocol_errors: list[str] = []
        self._lock = threading.Condition()
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    # ---- sending ------------------------------------------------------------------------------

    def send_bytes(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, payload: Any) -> None:
        self.send_bytes(message(payload))

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def request(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        msg_id = self.new_id() if msg_id is None else msg_id
        payload: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            payload["params"] = params
        self.send(payload)
        return msg_id

    def notify(self, method: str, params: Any = None) -> None:
        payload: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            payload["params"] = params
        self.send(payload)

    def call(self, method: str, params: Any = None, timeout: float = 30) -> dict[str, Any]:
        return self.wait_for(self.request(method, params), timeout)

    # ---- receiving ----------------------------------------------------------------------------

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            headers: dict[str, str] = {}
            while True:
                line = stream.readline()
                if not line:
                    return
                if line == b"\r\n":
                    break
                if not line.endswith(b"\r\n") or b":" not in line:
                    self.protocol_errors.append(f"bad header line from the server: {line!r}")
                    return
                name, _, value = line.decode("ascii").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "-1"))
            body = stream.read(length)
            try:
                payload = json.loads(body)
            except ValueError:
                self.protocol_errors.append(f"a body from the server that is not JSON: {body[:200]!r}")
                return
            with self._lock:
                if "method" in payload and "id" in payload:
                    self.requests.append(payload)
                    self.send({"jsonrpc": "2.0", "id": payload["id"], "result": None})
                elif "method" in payload:
                    self.notifications.append(payload)
                elif payload.get("id") is None:
                    self.null_errors.append(payload)
                else:
                    self.responses.setdefault(payload["id"], []).append(payload)
                self._lock.notify_all()

    def wait_for(self, msg_id: Any, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while msg_id not in self.responses:
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise AssertionError(f"no response to {msg_id!r} within {timeout}s "
                                         f"(server {'exited ' + str(self.process.returncode) if self.process.poll() is not None else 'alive'})")
                self._lock.wait(min(left, 0.1))
            return self.responses[msg_id][0]

    def wait_until(self, check: Any, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not check():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout}s waiting for {check}")
                self._lock.wait(min(left, 0.1))

    def log_lines(self) -> list[str]:
        return [n["params"]["message"] for n in list(self.notifications) if n.get("method") == "window/logMessage"]

    # ---- the session --------------------------------------------------------------------------

    def initialize(self, options: dict[str, Any] | None = None, capabilities: dict[str, Any] | None = None,
                   root_uri: str | None = None) -> dict[str, Any]:
        reply = self.call("initialize", {"processId": None, "rootUri": root_uri, "capabilities": capabilities or {},
                                         "initializationOptions": options or {}})
        self.notify("initialized", {})
        return reply

    def open(self, uri: str, text: str, language: str = "python", version: int = 1) -> None:
        self.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": language,
                                                              "version": version, "text": text}})

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the model has loaded (its log line)."""
        self.wait_until(lambda: any("model ready" in m or "could not be loaded" in m for m in self.log_lines()), timeout)

    def finish(self, timeout: float = 20) -> int:
        """shutdown, exit; the exit status."""
        if self.process.poll() is None:
            try:
                self.call("shutdown", timeout=timeout)
                self.notify("exit")
            except (AssertionError, BrokenPipeError, OSError):
                pass
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def rss_bytes(self) -> int:
        """The server process's resident memory."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")
