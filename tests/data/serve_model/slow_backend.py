"""Test doubles for ``serve-model``: a backend that writes slowly and notices cancellation, one that fails.

Also a script: ``python slow_backend.py PORT`` serves the slow backend with ``serve_model.serve`` (the
signal handling ``glm5-lsp serve-model`` uses) until SIGTERM.
"""

from __future__ import annotations

import sys
import threading
import time

from glm5_lsp.backends.base import Completion, CompletionRequest


class SlowBackend:
    """Writes ``piece`` every ``interval`` seconds, ``pieces`` times, checking ``should_cancel`` before
    each; records when it noticed a cancellation and when it returned."""

    name = "slow"
    supports_internals = False

    def __init__(self, pieces: int = 500, interval: float = 0.02, piece: str = "x") -> None:
        self.pieces, self.interval, self.piece = pieces, interval, piece
        self.started: list[float] = []
        self.cancelled_at: list[float] = []
        self.finished_at: list[float] = []
        self._lock = threading.Lock()

    def complete(self, request: CompletionRequest) -> Completion:
        self.started.append(time.monotonic())
        text, finish = "", "length"
        try:
            with self._lock:  # one at a time, as the real runtime
                for _ in range(min(self.pieces, request.max_tokens)):
                    if request.should_cancel is not None and request.should_cancel():
                        self.cancelled_at.append(time.monotonic())
                        finish = "cancelled"
                        break
                    time.sleep(self.interval)
                    text += self.piece
                    if request.on_text is not None:
                        request.on_text(self.piece)
            return Completion(text=text, finish_reason=finish, prompt_tokens=1, completion_tokens=len(text))
        finally:
            self.finished_at.append(time.monotonic())


class FailingBackend:
    """Raises a plain ``RuntimeError`` (a bug, not a BackendError) for every request."""

    name = "failing"
    supports_internals = False

    def complete(self, request: CompletionRequest) -> Completion:
        raise RuntimeError("the model broke")


def main(argv: list[str]) -> int:
    from glm5_lsp.serve_model import create_app, serve

    stopping = threading.Event()
    serve(create_app(SlowBackend(pieces=100_000, interval=0.01), "slow", stopping=stopping), "127.0.0.1",
          int(argv[0]), stopping, name="slow")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
