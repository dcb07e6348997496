"""Batch throughput: tasks per minute with 1 and 2 workers, side by side in one run.

The tasks come from this project's own source (no benchmark data): for each of the first N
functions in ``glm5_lsp/``, a ``complete`` task (cursor at the start of the body's second line),
a ``generate`` task (the signature plus docstring, or the signature alone) and a ``fix`` task (the
function with its first ``:`` removed, a syntax error), in that rotation. Every run uses the same
tasks, a fresh output file, the full pipeline (context engine, repair loop) and worker processes
(one model copy each, even for one worker, so every run pays the same start-up) with one torch
thread per worker, as ``glm5-lsp batch`` does by default; a third run gives one worker every core
through torch's intra-op threads (which a small model barely uses, and which lose much when other
processes compete for the cores). Times are wall-clock, worker start-up and model loading
included, after an untimed warm-up batch (jedi's and the OS's disk caches would otherwise favour
the later runs); "seconds/task in a worker" excludes start-up.

    python benchmarks/batch.py                       # the embedded default model
    python benchmarks/batch.py --model PATH --tasks 12 --max-tokens 32
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm5_lsp.batch import PipelineFactory, run_batch
from glm5_lsp.pipeline import PipelineSettings


def project_tasks(count: int) -> list[dict[str, object]]:
    """``count`` tasks cut from the project's own functions (complete, generate, fix in turn)."""
    tasks: list[dict[str, object]] = []
    for path in sorted((ROOT / "glm5_lsp").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef) or len(node.body) < 2 or node.end_lineno is None:
                continue
            function = "".join(lines[node.lineno - 1:node.end_lineno])
            if node.decorator_list or not function.startswith("def "):
                continue  # top-level plain functions only, so the code stands alone
            body_line = node.body[1].lineno - node.lineno
            head = "".join(function.splitlines(keepends=True)[:body_line])
            kind = ("complete", "generate", "fix")[len(tasks) % 3]
            task_id = f"{path.relative_to(ROOT)}:{node.name}"
            if kind == "complete":
                tasks.append({"id": task_id, "kind": kind, "prefix": head, "suffix": function[len(head):],
                              "path": str(path.relative_to(ROOT))})
            elif kind == "generate":
                docstring = ast.get_docstring(node)
                signature = function.split(":\n", 1)[0] + ":\n"
                prompt = signature + (f'    """{docstring.splitlines()[0]}"""\n' if docstring else "")
                tasks.append({"id": task_id, "kind": kind, "prompt": prompt})
            else:
                tasks.append({"id": task_id, "kind": kind, "code": function.replace(":\n", "\n", 1)})
            if len(tasks) == count:
                return tasks
    return tasks


def run(tasks_file: Path, model: Path, workers: int, max_tokens: int, threads: int) -> tuple[float, int, int, float]:
    """Wall seconds for the whole batch (worker start-up and model loading included), tasks done, errors,
    and the mean seconds one task took inside its worker."""
    settings = PipelineSettings(multiline_max_tokens=max_tokens, max_tokens=min(max_tokens, 64))
    settings.repair.return_unclean = True
    factory = PipelineFactory("local", {"model_path": model}, settings)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        out = Path(folder) / "out.jsonl"
        summary = run_batch(tasks_file, out, factory, workers=workers, progress=False, processes=True,
                            torch_threads=threads)
        seconds = time.perf_counter() - started
        per_task = [json.loads(line)["seconds"] for line in out.read_text(encoding="utf-8").splitlines()]
    return seconds, summary.done, summary.errors, sum(per_task) / max(1, len(per_task))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    if args.model is None:
        from glm5_lsp.model import default_model_path

        try:
            args.model = default_model_path()
        except FileNotFoundError as error:
            print(f"benchmarks/batch.py: {error}; pass --model PATH", file=sys.stderr)
            return 2
    os.environ.setdefault("GLM5_LSP_CACHE_DIR", tempfile.mkdtemp(prefix="glm5-bench-cache-"))
    tasks = project_tasks(args.tasks)
    cores = os.cpu_count() or 1
    # What `glm5-lsp batch --workers 1` and `--workers 2` do (one torch thread each), plus one worker
    # using every core through torch's intra-op threads instead.
    configs = [(1, 1), (2, 1), (1, cores)]
    with tempfile.TemporaryDirectory() as folder:
        tasks_file = Path(folder) / "tasks.jsonl"
        tasks_file.write_text("".join(json.dumps(task) + "\n" for task in tasks), encoding="utf-8")
        warm = Path(folder) / "warm.jsonl"  # untimed: fills jedi's and the OS's caches for both runs alike
        warm.write_text("".join(json.dumps(task) + "\n" for task in tasks[:3]), encoding="utf-8")
        run(warm, args.model, 1, args.max_tokens, 1)
        results = [run(tasks_file, args.model, workers, args.max_tokens, threads) for workers, threads in configs]
    print(f"model: {args.model}; {len(tasks)} tasks (complete/generate/fix from glm5_lsp's own functions); "
          f"max_tokens {args.max_tokens}; {cores} cores")
    print("| workers | torch threads each | wall seconds | tasks/minute | seconds/task in a worker | errors |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (workers, threads), (seconds, done, errors, per_task) in zip(configs, results):
        print(f"| {workers} | {threads} | {seconds:.1f} | {60 * done / seconds:.1f} | {per_task:.2f} | {errors} |")
    rate = [done / seconds for seconds, done, _, _ in results]
    print(f"2 workers / 1 worker: {rate[1] / rate[0]:.2f}x; 1 worker on {cores} threads / on 1 thread: "
          f"{rate[2] / rate[0]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
