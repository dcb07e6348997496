"""``glm5-lsp eval NAME --data PATH``: pass@k on a benchmark through the shared pipeline.

Candidates are tested in sandboxed subprocesses (``glm5_lsp.evaluate.sandbox``), never in this
process. Writes ``report.json`` (settings, summary, every sample) and ``report.md`` (a table row)
to ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from glm5_lsp.evaluate.datasets import NAMES, SUBSETS, DatasetError, load_problems
from glm5_lsp.evaluate.report import build_report, markdown_table, write_report
from glm5_lsp.evaluate.runner import evaluate
from glm5_lsp.evaluate.sandbox import SandboxLimits, SandboxUnavailable, require_isolation
from glm5_lsp.pipeline import Pipeline, PipelineSettings
from glm5_lsp.pipeline.session import BackendError, add_backend_arguments, backend_from_args


def _ks(text: str) -> list[int]:
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes comma-separated integers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise argparse.ArgumentTypeError("--k values must be >= 1")
    return ks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=NAMES, help="benchmark")
    parser.add_argument("--data", type=Path, required=True, help="the benchmark's .jsonl or .jsonl.gz file")
    parser.add_argument("--subset", choices=SUBSETS, default=None, help="humaneval-infilling subset (default: from the file)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--n-samples", type=int, default=1, help="candidates per problem")
    parser.add_argument("--k", type=_ks, default=[1], help="pass@k values, comma-separated (default: 1)")
    parser.add_argument("--temperature", type=float, default=None, help="default: 0 for one sample, 0.8 for more")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per candidate")
    parser.add_argument("--repair-rounds", type=int, default=3, help="generations per candidate (1: check only)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per test program")
    parser.add_argument("--memory-mb", type=int, default=1024, help="address-space limit per test program")
    parser.add_argument("--test-workers", type=int, default=2, help="test programs run at once")
    parser.add_argument("--unsafe-no-sandbox", action="store_true",
                        help="where the sandbox's namespaces cannot be made, run candidate code anyway with only "
                             "resource limits and a process sweep (it can then read and write your files and "
                             "use the network): only for code you trust")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the local model (as batch)")
    parser.add_argument("--out", type=Path, default=None, help="report folder (default: runs/eval/NAME-TIME)")
    parser.add_argument("--context", action="store_true",
                        help="build prompts with the context engine (default: the benchmark's prompt as is)")
    parser.add_argument("--no-progress", action="store_true")
    add_backend_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.n_samples < 1 or (args.limit is not None and args.limit < 1):
        print("glm5-lsp eval: --n-samples and --limit must be at least 1", file=sys.stderr)
        return 2
    too_big = [k for k in args.k if k > args.n_samples]
    if too_big:
        print(f"glm5-lsp eval: pass@{too_big[0]} needs --n-samples >= {too_big[0]}", file=sys.stderr)
        return 2
    limits = SandboxLimits(timeout_s=args.timeout, memory_mb=args.memory_mb, isolate=not args.unsafe_no_sandbox)
    try:
        require_isolation(limits)
    except SandboxUnavailable as error:
        print(f"glm5-lsp eval: {error}", file=sys.stderr)
        return 2
    if args.unsafe_no_sandbox:
        print("glm5-lsp eval: warning: --unsafe-no-sandbox: candidate code runs with your files and network",
              file=sys.stderr)
    try:
        problems, subset = load_problems(args.name, args.data, args.subset, args.limit)
    except DatasetError as error:
        print(f"glm5-lsp eval: {error}", file=sys.stderr)
        return 2
    temperature = args.temperature if args.temperature is not None else (0.0 if args.n_samples == 1 else 0.8)
    settings = PipelineSettings(multiline_max_tokens=args.max_tokens, temperature=temperature, unhurried=True)
    settings.repair.max_rounds = max(1, args.repair_rounds)
    settings.repair.return_unclean = True  # an unclean candidate may still pass its tests
    if args.backend == "local":
        import torch

        torch.set_num_threads(max(1, args.threads))
    try:
        backend = backend_from_args(args)
        backend.load()
    except (BackendError, ValueError) as error:
        print(f"glm5-lsp eval: {error}", file=sys.stderr)
        return 2
    context = None
    if args.context:
        from glm5_lsp.pipeline.session import context_engine

        context = context_engine()
    result = evaluate(problems, Pipeline(backend, settings, context=context), n_samples=args.n_samples, limits=limits,
                      test_workers=args.test_workers, progress=not args.no_progress)
    model = str(getattr(backend, "model_path", None) or getattr(backend, "model", "?"))
    meta = {
        "sandbox": "unsafe-no-sandbox" if args.unsafe_no_sandbox else "isolated",
        "benchmark": args.name, "subset": subset, "data": str(args.data), "model": model, "backend": backend.name,
        "n_samples": args.n_samples, "k": args.k, "temperature": temperature, "max_tokens": args.max_tokens,
        "repair_rounds": settings.repair.max_rounds, "context": bool(args.context), "timeout_s": args.timeout, "memory_mb": args.memory_mb,
        "command": "glm5-lsp eval " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["eval"] else None,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    report = build_report(result, args.k, meta)
    name = args.name + (f"-{subset}" if subset else "")
    folder = args.out or Path("runs") / "eval" / f"{name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    json_path, md_path = write_report(report, folder)
    summary = report["summary"]
    print(markdown_table(report), end="")
    for k in args.k:
        print(f"pass@{k}: {summary[f'pass@{k}']:.4f} ({summary['problems']} problems, {args.n_samples} samples each)")
    print(f"report: {json_path} and {md_path}")
    return 0
