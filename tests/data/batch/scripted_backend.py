"""A scripted test double for ``glm5_lsp.backends.base.Backend``: canned answers, streamed piece by piece.

Used where the behaviour under test is not the model (pipeline post-processing, batch resume). Also a
script: ``python scripted_backend.py IN OUT [--workers N] [--delay S] [--processes]`` runs ``glm5_lsp.batch`` over it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from glm5_lsp.backends.base import Completion, CompletionRequest

if TYPE_CHECKING:
    from glm5_lsp.pipeline import Pipeline


class ScriptedBackend:
    name = "scripted"
    supports_internals = False

    def __init__(self, answer: str | Callable[[CompletionRequest], str] = "pass", delay: float = 0.0,
                 piece: int = 3) -> None:
        self.answer = answer
        self.delay = delay
        self.piece = piece
        self.requests: list[CompletionRequest] = []

    def load(self) -> None:
        """Nothing to load (the Backend protocol's hook)."""

    def complete(self, request: CompletionRequest) -> Completion:
        self.requests.append(request)
        time.sleep(self.delay)
        full = self.answer(request) if callable(self.answer) else self.answer
        text, finish = "", "length"
        for start in range(0, len(full), self.piece):
            if request.should_cancel is not None and request.should_cancel():
                finish = "cancelled"
                break
            piece = full[start:start + self.piece]
            text += piece
            if request.on_text is not None:
                request.on_text(piece)
            hit = [text.find(stop) for stop in request.stop if stop in text]
            if hit:
                text, finish = text[:min(hit)], "stop"
                break
        else:
            finish = "stop"
        return Completion(text=text, finish_reason=finish, prompt_tokens=len(request.prompt.text()) // 4,
                          completion_tokens=len(text) // 4)


def echo_answer(request: CompletionRequest) -> str:
    """A deterministic answer derived from the prompt, so a test can tell tasks apart."""
    last = request.prompt.prefix.rstrip().rsplit("\n", 1)[-1].strip()
    return f"    return {len(last)}  # {last[:20]}\n"


class ScriptedPipelineFactory:
    """A picklable pipeline factory (worker processes need one) over :func:`echo_answer`."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self) -> Pipeline:
        from glm5_lsp.pipeline import Pipeline

        return Pipeline(ScriptedBackend(echo_answer, delay=self.delay))


def main(argv: list[str]) -> int:
    from glm5_lsp.batch import run_batch

    parser = argparse.ArgumentParser()
    parser.add_argument("input", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--processes", action="store_true")
    args = parser.parse_args(argv)
    summary = run_batch(args.input, args.output, ScriptedPipelineFactory(args.delay), workers=args.workers,
                        progress=False, processes=args.processes)
    print(f"done={summary.done} skipped={summary.skipped} errors={summary.errors}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))  # worker processes import this module by name
    sys.exit(main(sys.argv[1:]))
