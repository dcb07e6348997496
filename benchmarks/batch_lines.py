"""The rest of a line through ``glm5-lsp batch``, as a headless user runs it: on installed packages no
one here wrote, with and without the workspace memory, and (``--baseline CHECKOUT``) another checkout's
batch on the same tasks.

Each package of ``BENCHMARK_REPORT`` is copied into its own workspace folder and the same seeded
mid-line cursors as ``benchmarks/lines.py`` are cut there (``glm5_lsp.memory.heldout``: two characters
into an identifier, the rest of that line cut off, the lines below kept). Each cursor becomes one
``complete`` task (``prefix``, ``suffix``, the file's absolute ``path``); each system is one real
``python -m glm5_lsp.cli batch TASKS -o OUT --workspace <the package's folder>`` (a subprocess, one
worker, the embedded default model). The systems:

- **batch**: this checkout's batch at its defaults (the workspace memory on);
- **no memory**: the same with ``--no-memory`` (skipped for a checkout without the option);
- **baseline** (``--baseline CHECKOUT``): that checkout's batch at its defaults.

Figures: the answer's first line against the real rest of the line, as ``lines.py`` scores it
(shown, exact, right word, edit similarity, precision), and each task's ``seconds`` as the batch
recorded it (its pipeline's time; the process's start-up and the model's loading are not in it;
wall-clock per system is printed beside). Batch has no gate: it answers at every cursor it can.

    python benchmarks/batch_lines.py                                   # 8 packages x 10 cursors
    python benchmarks/batch_lines.py --packages tqdm wrapt --positions 20 --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from lines import Tally, checkout_commit, table_head, weights_commit

from glm5_lsp.memory.heldout import Case, copy_package, seeded_cases
from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT


def task_of(number: int, case: Case) -> dict:
    return {"id": number, "kind": "complete", "prefix": case.document[:case.offset],
            "suffix": case.document[case.offset:], "path": str(case.path)}


def run_batch(checkout: Path, tasks: Path, output: Path, workspace: Path, extra: list[str]) -> float:
    """One batch run of ``checkout``'s code (its own package first on the path); wall-clock seconds."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    command = [sys.executable, "-m", "glm5_lsp.cli", "batch", str(tasks), "-o", str(output),
               "--workspace", str(workspace), "--no-progress", *extra]
    started = time.perf_counter()
    done = subprocess.run(command, check=False, cwd=checkout, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if not output.exists():
        raise SystemExit(f"batch at {checkout} wrote nothing ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def has_option(checkout: Path, option: str) -> bool:
    return option in (checkout / "glm5_lsp" / "batch.py").read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", nargs="+", default=list(BENCHMARK_REPORT))
    parser.add_argument("--positions", type=int, default=10, help="cursors per package")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", default="", metavar="CHECKOUT", help="also run another checkout's batch")
    parser.add_argument("--fit", action="store_true", help="allow BENCHMARK_FIT packages (for tuning; never report them)")
    parser.add_argument("--details", default="", help="write each cursor's answers to this JSON-lines file")
    args = parser.parse_args(argv)
    allowed = set(BENCHMARK_REPORT) | (set(BENCHMARK_FIT) if args.fit else set())
    unknown = sorted(set(args.packages) - allowed)
    if unknown:
        parser.error(f"not a benchmark package: {', '.join(unknown)} (BENCHMARK_REPORT, or BENCHMARK_FIT with --fit)")
    systems: dict[str, tuple[Path, list[str]]] = {"batch": (REPO, [])}
    if has_option(REPO, "--no-memory"):
        systems["no memory"] = (REPO, ["--no-memory"])
    if args.baseline:
        baseline = Path(args.baseline).resolve()
        if not (baseline / "glm5_lsp" / "__init__.py").is_file():
            parser.error(f"--baseline {args.baseline}: not a checkout of this repository")
        systems["baseline"] = (baseline, [])
    print(f"packages: {', '.join(args.packages)}; {args.positions} cursors each (seed {args.seed}); "
          f"weights from commit {weights_commit() or '?'}")
    tallies = {name: Tally() for name in systems}
    wall = dict.fromkeys(systems, 0.0)
    details: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for package in args.packages:
            root = copy_package(package, Path(tmp) / "workspaces")
            cases = seeded_cases(root, args.positions, args.seed)
            tasks = Path(tmp) / f"{package}.tasks.jsonl"
            tasks.write_text("".join(json.dumps(task_of(i, c)) + "\n" for i, c in enumerate(cases)), encoding="utf-8")
            rows = [{"package": package, "path": str(c.path.relative_to(root)), "line": c.line,
                     "rest": c.rest} for c in cases]
            for name, (checkout, extra) in systems.items():
                output = Path(tmp) / f"{package}.{name.replace(' ', '_')}.jsonl"
                wall[name] += run_batch(checkout, tasks, output, root, extra)
                records = {r["id"]: r for r in map(json.loads, output.read_text(encoding="utf-8").splitlines())}
                for number, case in enumerate(cases):
                    record = records.get(number, {})
                    if record.get("error"):
                        print(f"  {package} task {number} ({name}): {record['error']}")
                    rows[number][name] = tallies[name].add(record.get("text") or "", case,
                                                           float(record.get("seconds") or 0.0))
            print(f"{package}: {len(cases)} cursors", flush=True)
            details.extend(rows)
    if args.details:
        Path(args.details).write_text("".join(json.dumps(r) + "\n" for r in details), encoding="utf-8")
    print()
    print(table_head("wall s"))
    labels = {"batch": "glm5-lsp batch --workspace (defaults)", "no memory": "the same, --no-memory",
              "baseline": f"batch at {args.baseline} ({checkout_commit(args.baseline) or '?'})"}
    for name in systems:
        print(f"{tallies[name].row(labels[name])} {wall[name]:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
