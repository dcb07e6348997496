"""One check of a document, as a completion runs three to five of them: the shipped Python runner
(its helper-process checkers called in the calling thread) against the same checkers each handed to
a thread of its own, side by side on the same one-line edits.

Each edit changes one line of a real module (the standard library's, so nobody here wrote it), so
no report is remembered from an earlier check (the runners' memory of recent reports is off). The
two ways alternate edit by edit; the figures are milliseconds per ``diagnose`` (median and p90) and
their ratio.

    python benchmarks/checks.py                       # 200 edits of argparse.py
    python benchmarks/checks.py --module textwrap --edits 100
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm5_lsp.checks.providers import DiagnosticRunner, default_runner


class OnAThread:
    """A checker with its bound hidden: the runner hands it to a thread, as it did every checker."""

    def __init__(self, provider) -> None:
        self.provider = provider
        self.name = provider.name
        self.languages = provider.languages

    def diagnose(self, text: str, path: str, language: str):
        return self.provider.diagnose(text, path, language)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="argparse", help="a standard-library module to edit")
    parser.add_argument("--edits", type=int, default=200)
    args = parser.parse_args(argv)
    path = Path(importlib.import_module(args.module).__file__)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    shipped = default_runner("python")
    runners = {
        "calling thread (shipped)": DiagnosticRunner(shipped.providers, shipped.timeout_s, recent=None),
        "a thread each": DiagnosticRunner([OnAThread(p) for p in shipped.providers], shipped.timeout_s, recent=None),
    }
    inline = [p.name for p in shipped.providers if shipped.bounded(p)]
    print(f"{path.name}: {len(lines)} lines; checkers {[p.name for p in shipped.providers]}, "
          f"in the calling thread: {inline}")
    times: dict[str, list[float]] = {name: [] for name in runners}
    step = max(1, len(lines) // (args.edits + 1))
    for number in range(args.edits):
        at = (number + 1) * step % len(lines)
        edited = "\n".join(lines[:at] + [lines[at] + f"  # edit {number}"] + lines[at + 1:])
        for name, runner in runners.items():
            variant = edited + ("\n" if name.startswith("a thread") else "")  # never the same text twice
            started = time.perf_counter()
            runner.diagnose(variant, "edited.py", "python")
            times[name].append((time.perf_counter() - started) * 1000)
    print("| way | median ms | p90 ms |")
    print("|---|---|---|")
    for name, values in times.items():
        ordered = sorted(values)
        print(f"| {name} | {statistics.median(ordered):.2f} | {ordered[int(0.9 * len(ordered))]:.2f} |")
    first, second = (statistics.median(v) for v in times.values())
    print(f"threads / calling thread (median): {second / first:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
