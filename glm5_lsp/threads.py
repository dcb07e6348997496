"""Torch's thread count for the in-process model, set by each front end before the model runs.

The embedded model is small: each operation is tiny, and spread over several threads it mostly
waits for them. Where another program holds a core (a build, the editor, the background
training), torch's default of one thread a core was 6-8x slower than one thread: `glm5-lsp
generate --prompt 'def fib(n):' --max-new-tokens 256` took 26-30 s with two threads against 3.9-4.1 s
with one on this 2-core machine with the training running (BENCHMARKS.md). Every front end therefore defaults to one;
``--threads N`` is there for a larger model on a machine of its own.
"""

from __future__ import annotations

import argparse
import os
import sys

THREADS_HELP = ("torch threads for the in-process model (default 1: the embedded model is small, and many tiny "
                "multi-threaded operations stall when the editor and other programs share the cores)")


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)


def use_threads(count: int, command: str) -> None:
    """Run torch's operations on ``count`` threads (``SystemExit`` below one). Before torch is imported
    the count goes to ``OMP_NUM_THREADS``, which torch reads when it starts (a served model's backend
    never imports it)."""
    if count < 1:
        raise SystemExit(f"glm5-lsp {command}: --threads must be at least 1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(count)
    else:
        os.environ["OMP_NUM_THREADS"] = str(count)
