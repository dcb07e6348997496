"""A scripted OpenAI-compatible ``/v1/completions`` server on 127.0.0.1, for end-to-end tests.

It stands in for a served GLM-5 (a test double behind the project's real ``openai`` backend):
each rule of a JSON script says which prompt it answers (the code right before the cursor, and
optionally text the prompt must contain) and what to stream back, piece by piece with a delay, so
tests can observe cancellation and supersession. Every request is recorded, with how many pieces
were sent before the client went away.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = "<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"


@dataclass
class Rule:
    """Answer prompts whose code before the cursor ends with ``before_cursor`` (trailing spaces ignored)."""

    before_cursor: str
    reply: str
    contains: str = ""  # the whole prompt must also contain this
    piece_chars: int = 4  # characters per streamed piece
    delay_ms: int = 0  # pause before each piece
    status: int = 200  # anything else: an error answer with this status


@dataclass
class Record:
    prefix: str
    suffix: str
    stream: bool
    rule: str
    pieces_sent: int = 0
    pieces_total: int = 0
    finished: bool = False


@dataclass
class ScriptedOpenAI:
    rules: list[Rule]
    records: list[Record] = field(default_factory=list)

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedOpenAI:
        return cls([Rule(**item) for item in json.loads(Path(path).read_text(encoding="utf-8"))])

    def start(self) -> str:
        """Serve on a free loopback port in a daemon thread; returns the base URL."""
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if self.path != "/v1/completions":
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                script.answer(self, body)

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def match(self, prefix: str, prompt: str) -> Rule | None:
        tail = prefix.rstrip(" ")
        for rule in self.rules:
            if tail.endswith(rule.before_cursor.rstrip(" ")) and rule.contains in prompt:
                return rule
        return None

    def answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        prompt = str(body.get("prompt", ""))
        prefix, suffix = prompt, ""
        if prompt.startswith(FIM_PREFIX) and FIM_SUFFIX in prompt:
            prefix, _, rest = prompt[len(FIM_PREFIX):].partition(FIM_SUFFIX)
            suffix = rest.removesuffix(FIM_MIDDLE)
        rule = self.match(prefix, prompt)
        record = Record(prefix, suffix, bool(body.get("stream")), rule.before_cursor if rule else "")
        self.records.append(record)
        if rule is None:
            reply, status = "", 200
        else:
            reply, status = rule.reply, rule.status
        if status != 200:
            handler._json(status, {"error": {"message": f"scripted failure {status}"}})  # type: ignore[attr-defined]
            return
        size = rule.piece_chars if rule else 4
        pieces = [reply[i : i + size] for i in range(0, len(reply), size)]
        record.pieces_total = len(pieces)
        if not body.get("stream"):
            handler._json(200, {"choices": [{"text": reply, "finish_reason": "stop"}],  # type: ignore[attr-defined]
                                "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(pieces)}})
            record.pieces_sent, record.finished = len(pieces), True
            return
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        try:
            for piece in pieces:
                if rule and rule.delay_ms:
                    time.sleep(rule.delay_ms / 1000)
                _chunk(handler, {"choices": [{"text": piece, "finish_reason": None}]})
                record.pieces_sent += 1
            _chunk(handler, {"choices": [{"text": "", "finish_reason": "stop"}]})
            _chunk(handler, "[DONE]")
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
            record.finished = True
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up: a cancelled request


def _chunk(handler: BaseHTTPRequestHandler, event: Any) -> None:
    data = ("data: " + (event if isinstance(event, str) else json.dumps(event)) + "\n\n").encode()
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()
