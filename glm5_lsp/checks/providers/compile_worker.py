"""Python's compiler in a helper process, so a check never stalls the model's thread.

``compile()`` is one C call that holds the interpreter lock from start to end (8-25 ms on a
2,600-line file), and the repair loop checks the document while the model decodes in another thread
of the same process: every such check stopped the decoding for its whole length. In a helper process
the check costs the other core instead.

:class:`CompileWorker` keeps one ``python -m glm5_lsp.checks.providers.compile_worker`` process and
talks to it in JSON lines over its stdin and stdout: a request ``{"text", "filename"}``, or
``{"edit": [start, end, text], "filename"}`` for the helper's last text with ``[start:end]`` replaced
(a candidate differs from the document in a line: its check sends that, not the file), an answer
``{"diagnostics": [[line, col, end_line, end_col, message, severity, source, code], ...]}`` or
``{"error": "..."}`` (after which the next request sends its whole text). The helper answers with
:class:`~glm5_lsp.checks.providers.compile.RecentCompiles`, so its incremental checks (one segment
recompiled after a small edit) are kept across requests.

One request at a time (a lock); an answer not back within the timeout kills the helper and raises
``TimeoutError``; a helper that died raises ``RuntimeError`` with its exit status. Either way the
next request starts a fresh helper. Reading with a timeout needs ``select`` on a pipe, which POSIX
has: elsewhere :func:`worker_available` is False and the provider compiles in-process.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from glm5_lsp.checks.providers.process import Submitted, end_process, kill_if_running
from glm5_lsp.diagnostics import Diagnostic
from glm5_lsp.textdiff import diff_region

log = logging.getLogger(__name__)

_MAX_MESSAGE = 2000  # characters of a failure's description sent back


def worker_available() -> bool:
    return os.name == "posix"


class CompileWorker:
    """A helper process answering compile checks; started on first use, restarted after a failure."""

    def __init__(self, timeout_s: float = 10.0, recent_texts: int = 4) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.argv = [sys.executable, "-m", __name__, str(recent_texts)]  # the helper's command line
        self.started = 0  # helper processes started (for tests and logs)
        self.answered = 0  # answers received, failures reported by the helper included
        self._process: subprocess.Popen[bytes] | None = None
        self._held: str | None = None  # the helper's last text (None: the next request sends the whole text)
        self._lock = threading.Lock()

    def diagnose(self, text: str, filename: str) -> list[Diagnostic]:
        return self.submit(text, filename)()

    def submit(self, text: str, filename: str) -> Callable[[], list[Diagnostic]]:
        """Send the check to the helper and return at once; the returned function waits for its
        answer (the caller's other work, another helper's check, runs meanwhile). Call it once: the
        helper is this check's until then, and other checks wait for it."""
        self._lock.acquire()
        try:
            process = self._running()
            held = self._held
            if held is None:
                message: dict[str, object] = {"text": text, "filename": filename}
            else:  # what differs from the helper's last text: a candidate's check sends a line, not the file
                start, end, inserted = diff_region(held, text)
                message = {"edit": [start, end, inserted], "filename": filename}
            # ASCII escapes carry any str, lone surrogates from an editor's UTF-16 included.
            request = json.dumps(message).encode("ascii") + b"\n"
            assert process.stdin is not None
            self._held = None  # until the request is sure to be written whole
            process.stdin.write(request)
            process.stdin.flush()
            self._held = text
        except OSError as error:
            status = self._stop()
            self._lock.release()
            raise RuntimeError(f"the compile helper stopped (exit status {status}): {error}") from None
        except BaseException:
            self._lock.release()
            raise
        deadline = time.monotonic() + self.timeout_s
        return Submitted(lambda: self._answer(process, deadline))

    def _answer(self, process: subprocess.Popen[bytes], deadline: float) -> list[Diagnostic]:
        """The answer to the request just sent; the lock ``submit`` took is let go here."""
        try:
            answer = self._read_line(process, deadline)
            self.answered += 1
        except TimeoutError:
            self._stop()
            raise TimeoutError(f"the compile helper gave no answer within {self.timeout_s:g}s") from None
        except (OSError, EOFError) as error:
            status = self._stop()
            raise RuntimeError(f"the compile helper stopped (exit status {status}): {error}") from None
        finally:
            self._lock.release()
        reply = json.loads(answer)
        if "error" in reply:
            self._held = None  # the next request carries its whole text
            raise RuntimeError(f"the compile helper failed: {reply['error']}")
        return [Diagnostic(*fields) for fields in reply["diagnostics"]]

    def start(self) -> None:
        """Start the helper now (its interpreter takes about 0.1 s to come up, in its own process),
        so the first check does not wait for it."""
        with self._lock:
            self._running()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        if self._process is not None:
            log.warning("the compile helper had stopped (exit status %s); starting another", self._process.returncode)
        self._held = None
        self._process = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        self.started += 1
        return self._process

    def _read_line(self, process: subprocess.Popen[bytes], deadline: float) -> bytes:
        """The helper's answer: one line (its JSON is ASCII, so the only line break is the last byte)."""
        assert process.stdout is not None
        fd = process.stdout.fileno()
        chunks: list[bytes] = []
        while not chunks or not chunks[-1].endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("its output closed")
            chunks.append(chunk)
        return b"".join(chunks)

    def _stop(self) -> int | None:
        self._held = None
        process, self._process = self._process, None
        return end_process(process) if process is not None else None

    def __del__(self) -> None:  # a dropped worker does not leave its helper behind
        kill_if_running(getattr(self, "_process", None))


def serve(recent_texts: int, stdin=None, stdout=None) -> None:
    """The helper's loop: one JSON request a line in, one JSON answer a line out, until end of input."""
    from glm5_lsp.checks.providers.compile import RecentCompiles

    source = stdin if stdin is not None else sys.stdin.buffer
    sink = stdout if stdout is not None else sys.stdout.buffer
    recent = RecentCompiles(recent_texts)
    held: str | None = None  # the last text asked about, which an "edit" request changes
    for line in source:
        try:
            request = json.loads(line)
            if "edit" in request:
                if held is None:
                    raise ValueError("an edit before any text")
                start, end, inserted = request["edit"]
                held = held[:start] + inserted + held[end:]
            else:
                held = request["text"]
            found = recent.diagnose(held, request["filename"])
            reply = {"diagnostics": [[d.line, d.col, d.end_line, d.end_col, d.message, d.severity, d.source, d.code]
                                     for d in found]}
        except Exception as error:  # noqa: BLE001 -- reported to the caller, which skips the check
            reply = {"error": f"{type(error).__name__}: {error}"[:_MAX_MESSAGE]}
        sink.write(json.dumps(reply).encode("ascii") + b"\n")
        sink.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
