"""ruff's checks from one long-lived ``ruff server``, asked over the Language Server Protocol.

``ruff check`` as a fresh process costs about 9 ms on a 2,600-line file, 5 ms of it the process
starting; the repair loop runs one to three such checks on the path of every completion. A ``ruff
server`` kept running answers the same check in about 4 ms. :class:`RuffServerProvider` reports
what :class:`~glm5_lsp.checks.providers.ruff.RuffProvider` reports (the same rules, codes,
severities and character columns; messages as the server words them, without its "help:" line).

The server is set up like ``ruff check --isolated``: ``configurationPreference: "editorOnly"``
ignores every ``pyproject.toml`` and ``ruff.toml``, no path is excluded (the CLI checks whatever
``--stdin-filename`` names), and the workspace is an empty temporary folder. Each ``path`` is one
open document (its file URI, since the name matters to ruff: ``__init__.py``, ``.pyi``; an empty
path is ``candidate.py`` in the workspace folder): opened once, then changed by ``didChange`` (the
range that differs from what the server holds, where it takes ranges; else the whole text), the
least recently checked closed past :data:`OPEN_DOCUMENTS`. A check is that change and a pull request
(``textDocument/diagnostic``).

As :mod:`.compile_worker`: one request at a time (a lock); an answer not back within ``timeout_s``
kills the server and raises ``TimeoutError``; a server that died raises ``RuntimeError`` with its
exit status; either way the next check starts another. The server's own requests are answered so it
never waits, its notifications (logs, pushed diagnostics) dropped. Reading with a timeout needs
``select`` on pipes (POSIX; elsewhere ``default_providers`` keeps ``RuffProvider``). A server that
cannot be started, stops before answering ``initialize`` or does not know pull diagnostics, before
any answer (a ruff without ``server``), is given up for one ``ruff check`` a check, with one warning.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glm5_lsp.checks.providers.process import DEFAULT_TIMEOUT_S, Submitted, end_process, kill_if_running
from glm5_lsp.checks.providers.ruff import RuffProvider, find_ruff, ruff_diagnostic
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.positions import column_from_units
from glm5_lsp.textdiff import diff_region, line_col

log = logging.getLogger(__name__)

OPEN_DOCUMENTS = 8  # documents kept open in the server; past this the least recently checked is closed
_INITIALIZE_ID = 0
_HELP = "\n\nhelp: "  # the server appends its fix's title to a message; the CLI's JSON keeps it apart
_METHOD_NOT_FOUND = -32601
_INCREMENTAL = 2  # TextDocumentSyncKind.Incremental


class RuffServerUnavailable(RuntimeError):
    """The server could not be started, stopped before answering ``initialize``, or cannot answer
    pull-diagnostic requests: before any answer, the provider runs ``ruff check`` instead."""


class RuffServerProvider:
    """``ruff server`` answering pull-diagnostic requests; started on first use (or :meth:`start`),
    restarted after a failure."""

    name = "ruff"
    languages = frozenset({"python"})

    def __init__(self, executable: str | None = None, select: tuple[str, ...] = ("E9", "F"),
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.executable = find_ruff(executable)
        self.select = select
        self.timeout_s = timeout_s
        self.argv = [self.executable, "server"]  # the server's command line
        self.position_encodings = ["utf-32", "utf-16"]  # offered in this order; the server picks one
        self.started = 0  # server processes started (for tests and logs)
        self.answered = 0  # diagnostic answers received
        self.fallback: RuffProvider | None = None  # set once the server could not be started at all
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._workspace: tempfile.TemporaryDirectory[str] | None = None
        self._initialized = False  # the answer to ``initialize`` is in and ``initialized`` sent
        self._incremental = False  # the server takes a change as a range and its text (sync kind 2)
        self.position_encoding = "utf-16"  # what the server chose (LSP's default until it answers)
        self._buffer = bytearray()  # what the server wrote that is not a whole message yet
        self._documents: OrderedDict[str, tuple[str, str]] = OrderedDict()  # path -> (uri, text), oldest first
        self._version = 0
        self._next_id = _INITIALIZE_ID

    @property
    def bounded_s(self) -> float:
        """A check's deadline (``DiagnosticProvider``): the server answers one check at a time."""
        return self.timeout_s

    def diagnose(self, text: str, path: str, language: str) -> list[Diagnostic]:
        return self.submit(text, path, language)()

    def submit(self, text: str, path: str, language: str) -> Callable[[], list[Diagnostic]]:
        """The check sent to the server, as much of it as its pipe takes without waiting (the runner's
        other checks run while ruff lints); calling the result waits for the answer. Call it once:
        the server is this check's until then, and other checks wait for it."""
        fallback = self.fallback
        if fallback is not None:
            return functools.partial(fallback.diagnose, text, path, language)
        try:
            sent = self._send(text, path)
        except RuffServerUnavailable as error:
            return functools.partial(self._given_up, error, text, path, language)

        def answered() -> list[Diagnostic]:
            try:
                items, encoding = self._receive(*sent)
            except RuffServerUnavailable as error:
                return self._given_up(error, text, path, language)
            return self._convert(text, items, encoding)
        return Submitted(answered)

    def _given_up(self, error: RuffServerUnavailable, text: str, path: str, language: str) -> list[Diagnostic]:
        """After ``error``: raised when the server had answered before (the next check starts
        another); else (a ruff without ``server``, say) one ``ruff check`` a check from now on."""
        if self.answered:
            raise error
        with self._lock:
            if self.fallback is None:
                log.warning("`%s` cannot answer checks (%s); ruff runs as one `ruff check` a check from now on",
                            " ".join(self.argv), error)
                self._stop()
                self.fallback = RuffProvider(self.executable, self.select, self.timeout_s)
            fallback = self.fallback
        return fallback.diagnose(text, path, language)

    def start(self) -> None:
        """Start the server now and send it ``initialize`` (its answer is read by the first check),
        so the first check does not wait for the process to come up."""
        with self._lock:
            if self.fallback is None:
                try:
                    self._running()
                except RuffServerUnavailable as error:
                    log.info("ruff server not started early: %s", error)

    def close(self) -> None:
        """Shut the server down (politely, then by force)."""
        with self._lock:
            process = self._process
            if process is not None and process.poll() is None and self._initialized:
                try:
                    shutdown = self._request("shutdown", None)
                    self._exchange(process, _frame(shutdown), shutdown["id"], time.monotonic() + 1.0)
                    self._exchange(process, _frame(_notification("exit", None)), None, time.monotonic() + 1.0)
                    process.wait(timeout=1.0)
                except (OSError, EOFError, ValueError, TimeoutError, subprocess.TimeoutExpired):
                    pass  # it is killed below
            self._stop()

    @property
    def open_documents(self) -> tuple[str, ...]:
        """The paths whose documents the server holds open, least recently checked first."""
        with self._lock:
            return tuple(self._documents)

    # -- one check ---------------------------------------------------------------------------

    def _send(self, text: str, path: str) -> tuple[subprocess.Popen[bytes], int, bytes, float]:
        """Take the server (its lock, let go by :meth:`_receive`) and write what its pipe takes of the
        check at once: ``(process, request id, what is left to send, deadline)``. Before the answer
        to ``initialize`` is in, nothing is sent yet."""
        self._lock.acquire()
        try:
            process = self._running()
            deadline = time.monotonic() + self.timeout_s
            request = self._request("textDocument/diagnostic", None)
            check = self._sync(text, path, request)  # raises (a lone surrogate) before anything is sent
            if self._initialized:
                assert process.stdin is not None
                try:
                    check = check[os.write(process.stdin.fileno(), check[:1 << 16]):]
                except BlockingIOError:
                    pass
                except OSError as error:
                    status = self._stop(grace_s=1.0)
                    raise RuntimeError(f"the ruff server stopped (exit status {status}): {error}") from None
        except BaseException:
            self._lock.release()
            raise
        return process, request["id"], check, deadline

    def _receive(self, process: subprocess.Popen[bytes], request_id: int, check: bytes,
                 deadline: float) -> tuple[list[dict[str, Any]], str]:
        """The rest of :meth:`_send`'s check written and its answer read; the lock let go."""
        try:
            outgoing = b""
            if not self._initialized:
                answer = self._exchange(process, b"", _INITIALIZE_ID, deadline)
                if "error" in answer:
                    self._stop()
                    raise RuffServerUnavailable(f"the ruff server refused to start: {_describe(answer['error'])}")
                capabilities = (answer.get("result") or {}).get("capabilities") or {}
                self.position_encoding = capabilities.get("positionEncoding") or "utf-16"
                sync = capabilities.get("textDocumentSync")
                self._incremental = (sync.get("change") if isinstance(sync, dict) else sync) == _INCREMENTAL
                self._initialized = True
                outgoing = _frame(_notification("initialized", {}))
            answer = self._exchange(process, outgoing + check, request_id, deadline)
            if "error" not in answer:
                self.answered += 1
        except TimeoutError:
            self._stop()
            raise TimeoutError(f"the ruff server gave no answer within {self.timeout_s:g}s") from None
        except (OSError, EOFError, ValueError) as error:
            unavailable = not self._initialized
            status = self._stop(grace_s=0.0 if isinstance(error, ValueError) else 1.0)  # garbage: still running
            failure = RuffServerUnavailable if unavailable else RuntimeError
            raise failure(f"the ruff server stopped (exit status {status}): {error}") from None
        finally:
            self._lock.release()
        if "error" in answer:
            error = answer["error"] or {}
            failure = RuffServerUnavailable if error.get("code") == _METHOD_NOT_FOUND else RuntimeError
            raise failure(f"the ruff server failed: {_describe(error)}")
        return list((answer.get("result") or {}).get("items") or []), self.position_encoding

    def _sync(self, text: str, path: str, request: dict[str, Any]) -> bytes:
        """The messages that make the server's document for ``path`` hold ``text``, then ``request``
        for it: ``didOpen`` the first time, ``didChange`` (the whole text) when it changed."""
        known = self._documents.get(path)
        uri = known[0] if known is not None else self._uri(path)
        self._version += 1
        messages = []
        if known is None:
            messages.append(_notification("textDocument/didOpen", {"textDocument": {
                "uri": uri, "languageId": "python", "version": self._version, "text": text}}))
        elif known[1] != text:
            messages.append(_notification("textDocument/didChange", {
                "textDocument": {"uri": uri, "version": self._version}, "contentChanges": [self._change(known[1], text)]}))
        request["params"] = {"textDocument": {"uri": uri}}
        evicted = list(self._documents.items())[:max(0, len(self._documents) - OPEN_DOCUMENTS + 1)] if known is None else []
        messages[:0] = [_notification("textDocument/didClose", {"textDocument": {"uri": old_uri}})
                        for _, (old_uri, _) in evicted]
        data = b"".join(_frame(message) for message in [*messages, request])  # a lone surrogate raises here
        for old_path, _ in evicted:  # the server's state changes only once the bytes are sure to go
            del self._documents[old_path]
        self._documents[path] = (uri, text)
        self._documents.move_to_end(path)
        return data

    def _change(self, old: str, new: str) -> dict[str, Any]:
        """The content change that turns the server's ``old`` text into ``new``: the replaced range
        alone where the server takes ranges in code points (utf-32) and no carriage return can make
        the lines ambiguous (a lone one ends a line for the server, not for us), else the whole text.
        A candidate differs from the document in a line or two: its check then sends those, not the
        file (encoding a 100 kB text as JSON cost 0.5 ms a check)."""
        if not self._incremental or self.position_encoding != "utf-32" or "\r" in old or "\r" in new:
            return {"text": new}
        start, end, inserted = diff_region(old, new)
        (start_line, start_col), (end_line, end_col) = line_col(old, start), line_col(old, end)
        return {"range": {"start": {"line": start_line, "character": start_col},
                          "end": {"line": end_line, "character": end_col}}, "text": inserted}

    def _uri(self, path: str) -> str:
        if not path:
            assert self._workspace is not None
            return (Path(self._workspace.name) / "candidate.py").as_uri()
        return Path(os.path.abspath(path)).as_uri()

    def _convert(self, text: str, items: list[dict[str, Any]], encoding: str) -> list[Diagnostic]:
        lines = text.split("\n") if items else []
        found = []
        for item in items:
            where = item.get("range") or {}
            start, end = where.get("start") or {}, where.get("end") or {}
            line, end_line = int(start.get("line", 0)), int(end.get("line", 0))
            col, end_col = int(start.get("character", 0)), int(end.get("character", 0))
            if encoding != "utf-32":  # UTF-16 code units to code points
                col, end_col = _code_points(lines, line, col), _code_points(lines, end_line, end_col)
            message = str(item.get("message", "")).split(_HELP, 1)[0]
            found.append(ruff_diagnostic(lines, item.get("code"), message, (line, col), (end_line, end_col), self.name))
        return sorted(found, key=lambda d: (d.line, d.col))  # position order, as ``ruff check`` lists them

    # -- the process and the protocol -----------------------------------------------------------

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        if self._process is not None:
            log.warning("the ruff server had stopped (exit status %s); starting another", self._process.returncode)
            self._stop()
        workspace = tempfile.TemporaryDirectory(prefix="glm5-lsp-ruff-")
        try:
            process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, bufsize=0, cwd=workspace.name)
        except OSError as error:
            workspace.cleanup()
            raise RuffServerUnavailable(f"could not start `{' '.join(self.argv)}`: {error}") from None
        assert process.stdin is not None
        os.set_blocking(process.stdin.fileno(), False)  # written as the pipe takes it, never blocking
        self._process, self._workspace = process, workspace
        self.started += 1
        self._buffer.clear()
        self._documents.clear()
        self._initialized = False
        self._incremental = False
        self._next_id = _INITIALIZE_ID + 1
        root = Path(workspace.name).as_uri()
        initialize = {"jsonrpc": "2.0", "id": _INITIALIZE_ID, "method": "initialize", "params": {
            "processId": os.getpid(), "rootUri": root, "workspaceFolders": [{"uri": root, "name": "glm5-lsp"}],
            "capabilities": {"general": {"positionEncodings": list(self.position_encodings)},
                             "textDocument": {"diagnostic": {"dynamicRegistration": False}}},
            "initializationOptions": {"settings": self._settings()}}}
        try:  # a few hundred bytes: the pipe takes them at once
            self._exchange(process, _frame(initialize), None, time.monotonic() + self.timeout_s)
        except (OSError, EOFError, ValueError, TimeoutError) as error:
            status = self._stop(grace_s=1.0)
            raise RuffServerUnavailable(f"the ruff server stopped (exit status {status}): {error}") from None
        return process

    def _settings(self) -> dict[str, Any]:
        return {"configurationPreference": "editorOnly", "exclude": [], "showSyntaxErrors": True,
                "lint": {"enable": True, "select": list(self.select)}, "logLevel": "error"}

    def _request(self, method: str, params: Any) -> dict[str, Any]:
        self._next_id += 1
        return {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}

    def _exchange(self, process: subprocess.Popen[bytes], outgoing: bytes, request_id: int | None,
                  deadline: float) -> dict[str, Any]:
        """Write ``outgoing`` and read the server's messages until the answer to ``request_id`` is in
        (``None``: until everything is written). Both directions at once, so neither side can stall
        on a full pipe. Requests from the server are answered on the way."""
        assert process.stdin is not None and process.stdout is not None
        to_server, from_server = process.stdin.fileno(), process.stdout.fileno()
        sent = 0
        answer: dict[str, Any] | None = None
        while True:
            while answer is None and (message := self._take_message()) is not None:
                if "method" not in message:
                    if message.get("id") == request_id:
                        answer = message
                elif "id" in message:
                    outgoing = outgoing[sent:] + _frame(self._reply(message))
                    sent = 0
            if sent == len(outgoing) and (answer is not None or request_id is None):
                return answer or {}
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            readable, writable, _ = select.select([from_server], [to_server] if sent < len(outgoing) else [], [], left)
            if not readable and not writable:
                raise TimeoutError
            if writable:
                try:
                    sent += os.write(to_server, outgoing[sent:sent + (1 << 16)])
                except BlockingIOError:
                    pass
            if readable:
                chunk = os.read(from_server, 1 << 16)
                if not chunk:
                    raise EOFError("its output closed")
                self._buffer += chunk

    def _take_message(self) -> dict[str, Any] | None:
        """The first whole message in the buffer, taken out of it; None while it is incomplete."""
        head_end = self._buffer.find(b"\r\n\r\n")
        if head_end < 0:
            return None
        length = None
        for header in bytes(self._buffer[:head_end]).split(b"\r\n"):
            name, _, value = header.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            raise ValueError(f"a message without Content-Length: {bytes(self._buffer[:200])!r}")
        body_start = head_end + 4
        if len(self._buffer) < body_start + length:
            return None
        body = bytes(self._buffer[body_start:body_start + length])
        del self._buffer[:body_start + length]
        return json.loads(body)

    def _reply(self, message: dict[str, Any]) -> dict[str, Any]:
        """An answer to a request from the server: our settings for its configuration, else null."""
        result: Any = None
        if message.get("method") == "workspace/configuration":
            items = (message.get("params") or {}).get("items") or []
            result = [self._settings() if item.get("section") == "ruff" else None for item in items]
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    def _stop(self, grace_s: float = 0.0) -> int | None:
        """End the server (given ``grace_s`` to exit by itself, so a crash reports its own status)."""
        process, self._process = self._process, None
        workspace, self._workspace = self._workspace, None
        self._documents.clear()
        self._initialized = False
        status = end_process(process, grace_s) if process is not None else None
        if workspace is not None:
            workspace.cleanup()
        return status

    def __del__(self) -> None:  # a dropped provider does not leave its server behind
        kill_if_running(getattr(self, "_process", None))


def _describe(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    return f"{error.get('message')} (code {error.get('code')})"


def _notification(method: str, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, ensure_ascii=False).encode("utf-8")  # a lone surrogate raises UnicodeEncodeError
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _code_points(lines: list[str], line: int, units: int) -> int:
    """A UTF-16 column on ``lines[line]`` in code points (clamped to the line's end)."""
    if not 0 <= line < len(lines) or units <= 0:
        return units
    column = column_from_units(lines[line], units, "utf-16")
    return len(lines[line]) if column is None else column
