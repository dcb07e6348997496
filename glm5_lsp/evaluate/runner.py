"""Run benchmark problems through the pipeline and test every candidate in the sandbox."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm import tqdm

from glm5_lsp.evaluate.datasets import Problem
from glm5_lsp.evaluate.passk import mean_pass_at_k
from glm5_lsp.evaluate.sandbox import SandboxLimits, require_isolation, run_program
from glm5_lsp.pipeline import Pipeline, PipelineResult

log = logging.getLogger(__name__)
_STDERR_KEPT = 600  # characters of a failing test's stderr kept in the report


@dataclass
class SampleOutcome:
    task_id: str
    sample: int
    passed: bool
    status: str  # sandbox status ("passed", "failed", "timeout") or "error" when generation failed
    candidate: str
    clean: bool = False
    rounds: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    generation_seconds: float = 0.0
    test_seconds: float = 0.0
    error: str | None = None
    stderr: str = ""


@dataclass
class EvalResult:
    samples: list[SampleOutcome] = field(default_factory=list)
    seconds: float = 0.0

    def counts(self) -> list[tuple[int, int]]:
        """``(n, c)`` per problem, in first-seen order."""
        table: dict[str, list[int]] = {}
        for outcome in self.samples:
            entry = table.setdefault(outcome.task_id, [0, 0])
            entry[0] += 1
            entry[1] += outcome.passed
        return [(n, c) for n, c in table.values()]

    def summary(self, ks: list[int]) -> dict[str, Any]:
        counts = self.counts()
        n = min((count[0] for count in counts), default=0)
        generated = [s for s in self.samples if s.error is None]
        return {
            "problems": len(counts),
            "samples_per_problem": n,
            **{f"pass@{k}": mean_pass_at_k(counts, k) for k in ks if k <= n},
            "clean_rate": sum(s.clean for s in generated) / max(1, len(generated)),
            "errors": sum(s.error is not None for s in self.samples),
            "seconds_per_sample": sum(s.generation_seconds for s in self.samples) / max(1, len(self.samples)),
            "completion_tokens": sum(s.completion_tokens for s in self.samples),
            "seconds": self.seconds,
        }


def generate_candidate(pipeline: Pipeline, problem: Problem) -> tuple[str, PipelineResult]:
    """The candidate text for one problem (what goes between the problem's program head and tail)."""
    if problem.kind == "generate":
        result = pipeline.generate(problem.prompt)
    elif problem.kind == "complete":
        result = pipeline.complete(problem.prefix + problem.suffix, len(problem.prefix), multiline=problem.multiline)
    elif problem.kind == "fix":
        result = pipeline.fix(problem.code, diagnostics=problem.hints)
    else:
        raise ValueError(f"unknown problem kind {problem.kind!r}")
    return result.text, result


def evaluate(
    problems: list[Problem],
    pipeline: Pipeline,
    n_samples: int = 1,
    limits: SandboxLimits | None = None,
    test_workers: int = 2,
    progress: bool = True,
) -> EvalResult:
    """``n_samples`` candidates per problem (sample ``i`` uses seed ``i``), each tested in the sandbox.

    Generation runs here, one candidate at a time; tests run alongside in ``test_workers`` threads,
    each in its own sandboxed subprocess. Raises ``SandboxUnavailable`` before generating anything
    when the limits ask for isolation this machine cannot give.
    """
    limits = limits or SandboxLimits()
    require_isolation(limits)
    started = time.perf_counter()
    samplers = [Pipeline(pipeline.backend, replace(pipeline.settings, seed=i), pipeline.context, pipeline.repair)
                for i in range(n_samples)]
    pending: list[tuple[SampleOutcome, Future[Any] | None, Problem]] = []
    bar = tqdm(total=len(problems) * n_samples, unit="sample", disable=not progress, dynamic_ncols=True, desc="eval")
    with ThreadPoolExecutor(max_workers=test_workers) as pool:
        for problem in problems:
            for index, sampler in enumerate(samplers):
                begun = time.perf_counter()
                try:
                    candidate, result = generate_candidate(sampler, problem)
                except Exception as error:  # noqa: BLE001 - one broken sample never ends the run
                    log.warning("%s sample %d: generation failed: %s", problem.task_id, index, error)
                    outcome = SampleOutcome(problem.task_id, index, False, "error", "",
                                            error=f"{type(error).__name__}: {error}",
                                            generation_seconds=time.perf_counter() - begun)
                    pending.append((outcome, None, problem))
                    bar.update(1)
                    continue
                outcome = SampleOutcome(
                    problem.task_id, index, False, "pending", candidate, clean=result.clean, rounds=result.rounds,
                    prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                    generation_seconds=time.perf_counter() - begun,
                )
                pending.append((outcome, pool.submit(run_program, problem.program(candidate), limits), problem))
                bar.update(1)
        bar.close()
        for outcome, future, _ in pending:
            if future is None:
                continue
            ran = future.result()
            outcome.passed, outcome.status, outcome.test_seconds = ran.passed, ran.status, ran.seconds
            if not ran.passed:
                outcome.stderr = ran.stderr[-_STDERR_KEPT:]
    return EvalResult([outcome for outcome, _, _ in pending], time.perf_counter() - started)
