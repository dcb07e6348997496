"""The repair loop and the decoding monitor on a real checkpoint, measured side by side.

Runs a GLM-5 checkpoint through the project's runtime (``LocalBackend``) on

- **HumanEvalFix** (HumanEvalPack Python): the buggy function is shown, then its signature and
  docstring again under ``# Fixed version``; the model writes the body, which is tested;
- **multi-line HumanEval-infilling**: the model fills the removed lines between prefix and suffix
  (fill-in-the-middle); the completed function is tested,

under four configurations: repair loop off/on x decoding monitor off/on ("loop off" = one
generation, returned whatever it is; "loop on" = up to ``--rounds`` generations, only a candidate
that adds no blocking diagnostic is returned). For each it prints: the share of tasks with a
returned candidate, the share of returned candidates that compile and are pyflakes-clean (no new
compile error, no new pyflakes error or warning, judged "introduced only" against the document
without the candidate), the share of tasks whose tests pass (executed in the sandboxed subprocess
with a timeout), seconds and rounds per task, and the ratios to the plain model.

    python benchmarks/repair.py --model PATH --limit 20 [--datasets fix,infill] [--out results.json]

Data is read from ``../shared/benchmarks`` (next to the repository); nothing is copied.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from glm5_lsp.backends.base import Backend, CompletionRequest
from glm5_lsp.checks.introduced import Splice, judge
from glm5_lsp.checks.providers import DiagnosticRunner, PyflakesProvider, PythonCompileProvider
from glm5_lsp.evaluate.sandbox import SandboxLimits, run_program
from glm5_lsp.pipeline import PYTHON_BODY_STOPS
from glm5_lsp.postprocess import cut_at_block_end, strip_special_tokens, strip_suffix_overlap
from glm5_lsp.repair.loop import LoopTask, RepairSettings, RepairTarget
from glm5_lsp.repair.standard import standard_loop
from glm5_lsp.spans import Prompt, Span

SHARED = ROOT.parent / "shared" / "benchmarks"
FIX_FILE = SHARED / "humanevalpack" / "humanevalpack.jsonl"
INFILL_FILE = SHARED / "humaneval-infilling" / "HumanEval-MultiLineInfilling.jsonl.gz"
CONFIGS: tuple[tuple[str, bool, bool], ...] = (
    ("plain", False, False), ("monitor", False, True), ("loop", True, False), ("loop+monitor", True, True),
)
log = logging.getLogger("benchmarks.repair")


@dataclass
class Task:
    task_id: str
    document: str  # the code the candidate is spliced into, at ``at``
    at: int
    prompt: Prompt
    test: str  # appended to the spliced code to make the test program
    stop: list[str]
    postprocess: Callable[[str], str]


def fix_tasks(limit: int) -> Iterator[Task]:
    with FIX_FILE.open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            if index >= limit:
                return
            row = json.loads(line)
            shown = row["declaration"] + row["buggy_solution"]
            prefix = f"{shown}\n\n# Fixed version of {row['entry_point']}\n{row['prompt']}"
            span = Span(len(prefix) - len(row["prompt"]), len(prefix), "current_block")
            yield Task(row["task_id"], prefix, len(prefix), Prompt(prefix, "", [span]), "\n" + row["test"] + "\n",
                       list(PYTHON_BODY_STOPS), _body_postprocess(prefix))


def infill_tasks(limit: int) -> Iterator[Task]:
    """``limit`` tasks spread over the whole file (one every len/limit), not the first problem's many."""
    with gzip.open(INFILL_FILE, "rt", encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines]
    step = max(1, len(rows) // max(limit, 1))
    for row in rows[::step][:limit]:
        prefix, suffix = row["prompt"], row["suffix"]
        document = prefix + suffix
        test = f"\n{row['test']}\ncheck({row['entry_point']})\n"
        yield Task(row["task_id"], document, len(prefix), Prompt(prefix, suffix), test, [],
                   _infill_postprocess(suffix))


def _body_postprocess(prefix: str) -> Callable[[str], str]:
    def clean(text: str) -> str:
        text = strip_special_tokens(text)
        for stop in PYTHON_BODY_STOPS:
            if stop in text:
                text = text[: text.index(stop)]
        text = cut_at_block_end(text, prefix, "python").rstrip()
        return text + "\n" if text.strip() else ""

    return clean


def _infill_postprocess(suffix: str) -> Callable[[str], str]:
    def clean(text: str) -> str:
        text = strip_suffix_overlap(strip_special_tokens(text), suffix, at_line_start=True).rstrip()
        return text + "\n" if text.strip() else ""

    return clean


@dataclass
class Outcome:
    task_id: str
    returned: bool
    clean: bool | None  # compile + pyflakes-clean (None when nothing was returned)
    passed: bool
    seconds: float
    rounds: int
    tokens: int


@dataclass
class Summary:
    config: str
    tasks: int
    returned: float
    clean_of_returned: float
    passed: float
    seconds_per_task: float
    rounds_per_task: float
    tokens_per_task: float
    outcomes: list[Outcome] = field(default_factory=list)


def run_config(backend: Backend, token_strings: list[str], tasks: list[Task], name: str, loop_on: bool,
               monitor_on: bool, args: argparse.Namespace) -> Summary:
    settings = RepairSettings(
        max_rounds=args.rounds if loop_on else 1, return_unclean=not loop_on, time_budget_s=args.budget,
        monitor=monitor_on, use_external_checkers=False,
    )
    metric = DiagnosticRunner([PythonCompileProvider(), PyflakesProvider()], timeout_s=30)
    outcomes: list[Outcome] = []
    for task in tasks:
        loop = standard_loop(backend, settings, token_strings=token_strings)
        request = CompletionRequest(task.prompt, max_tokens=args.max_tokens, temperature=0.0, seed=0,
                                    stop=list(task.stop))
        target = RepairTarget(task.document, task.at, task.at, "task.py", "python")
        started = time.perf_counter()
        result = loop.run(request, target, LoopTask(postprocess=task.postprocess))
        seconds = time.perf_counter() - started
        returned = result.text is not None and result.text.strip() != ""
        clean: bool | None = None
        passed = False
        if returned:
            verdict = judge(Splice(task.document, task.at, task.at, result.text or ""), metric, "task.py", "python")
            clean = not verdict.blocking(("error", "warning"))
            program = verdict.spliced + task.test
            passed = run_program(program, SandboxLimits(timeout_s=args.test_timeout)).passed
        outcomes.append(Outcome(task.task_id, returned, clean, passed, seconds, result.rounds, result.tokens))
        log.info("%s %s returned=%s clean=%s passed=%s %.1fs rounds=%d", name, task.task_id, returned, clean,
                 passed, seconds, result.rounds)
    n = max(len(outcomes), 1)
    returned_n = sum(o.returned for o in outcomes)
    return Summary(
        name, len(outcomes), returned_n / n,
        sum(bool(o.clean) for o in outcomes) / returned_n if returned_n else float("nan"),
        sum(o.passed for o in outcomes) / n, sum(o.seconds for o in outcomes) / n,
        sum(o.rounds for o in outcomes) / n, sum(o.tokens for o in outcomes) / n, outcomes,
    )


def print_table(dataset: str, summaries: list[Summary]) -> None:
    base = summaries[0]
    print(f"\n{dataset}: {base.tasks} tasks")
    print(f"{'config':<14}{'returned':>9}{'clean/ret':>10}{'passed':>8}{'s/task':>8}{'rounds':>7}"
          f"{'tok/task':>9}{'pass x':>8}{'time x':>8}")
    for s in summaries:
        pass_ratio = s.passed / base.passed if base.passed else float("nan")
        time_ratio = s.seconds_per_task / base.seconds_per_task if base.seconds_per_task else float("nan")
        print(f"{s.config:<14}{s.returned:>9.1%}{s.clean_of_returned:>10.1%}{s.passed:>8.1%}{s.seconds_per_task:>8.2f}"
              f"{s.rounds_per_task:>7.2f}{s.tokens_per_task:>9.1f}{pass_ratio:>8.2f}{time_ratio:>8.2f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint folder (default: the embedded default model)")
    parser.add_argument("--limit", type=int, default=20, help="tasks per dataset")
    parser.add_argument("--datasets", default="fix,infill", help="comma list of: fix, infill")
    parser.add_argument("--configs", default=",".join(c[0] for c in CONFIGS), help="comma list of configurations")
    parser.add_argument("--rounds", type=int, default=3, help="generations per task with the loop on")
    parser.add_argument("--budget", type=float, default=120.0, help="time budget per task with the loop on (s)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--test-timeout", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", help="write every outcome as JSON here")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not FIX_FILE.is_file() or not INFILL_FILE.is_file():
        print(f"benchmark data not found under {SHARED}", file=sys.stderr)
        return 2
    import torch

    from glm5_lsp.backends.local import LocalBackend
    from glm5_lsp.model import default_model_path

    torch.set_num_threads(args.threads)
    try:
        model_path = Path(args.model) if args.model else default_model_path()
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    backend = LocalBackend(model_path)
    backend.load()
    token_strings = backend.tokenizer.token_strings()
    print(f"checkpoint: {model_path}")
    datasets = {"fix": ("HumanEvalFix (Python)", fix_tasks), "infill": ("HumanEval multi-line infilling", infill_tasks)}
    chosen = [c for c in CONFIGS if c[0] in args.configs.split(",")]
    report: dict[str, list[dict]] = {}
    for key in args.datasets.split(","):
        title, load = datasets[key]
        tasks = list(load(args.limit))
        summaries = [run_config(backend, token_strings, tasks, name, loop_on, monitor_on, args)
                     for name, loop_on, monitor_on in chosen]
        print_table(title, summaries)
        report[key] = [asdict(s) for s in summaries]
    if args.out:
        Path(args.out).write_text(json.dumps({"model": str(model_path), "args": vars(args), "results": report},
                                             indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
