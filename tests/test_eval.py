"""``glm5-lsp eval``: datasets, candidates tested in the sandbox, pass@k, reports, the CLI.

Data: small hand-written problems in the benchmarks' formats under ``tests/data/eval/``; the real
files in ``../shared/benchmarks`` when present (their canonical solutions must pass our programs).
"""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.evaluate.datasets import DatasetError, load_problems
from glm5_lsp.evaluate.runner import evaluate
from glm5_lsp.evaluate.sandbox import SandboxLimits, isolation_problem, run_program
from glm5_lsp.pipeline import Pipeline, PipelineSettings

DATA = Path(__file__).parent / "data" / "eval"
# Candidates run isolated where this machine can make the sandbox's namespaces; elsewhere (a container
# without user namespaces) unisolated: these are the tests' own programs. test_sandbox.py tests the rest.
LIMITS = SandboxLimits(isolate=isolation_problem() is None)
UNSAFE_FLAG = [] if LIMITS.isolate else ["--unsafe-no-sandbox"]
_spec = importlib.util.spec_from_file_location(
    "scripted_backend", Path(__file__).parent / "data" / "batch" / "scripted_backend.py")
assert _spec and _spec.loader
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)

VOWEL_BODY = ["    total = 0\n", "    for char in text.lower():\n", "        if char in 'aeiou':\n",
              "            total += 1\n", "    return total\n"]


def oracle(answers: dict[str, str]) -> scripted.ScriptedBackend:
    """Answers the text keyed by the first needle found in the prompt."""
    def answer(request: CompletionRequest) -> str:
        text = request.prompt.text()
        return next((reply for needle, reply in answers.items() if needle in text), "    return None\n")
    return scripted.ScriptedBackend(answer)


def pipeline(backend: object, **settings: object) -> Pipeline:
    chosen = PipelineSettings(**settings)  # type: ignore[arg-type]
    chosen.repair.return_unclean = True
    return Pipeline(backend, chosen)  # type: ignore[arg-type]


CANONICAL = {
    "def add": "    return a + b\n\n\ndef unrelated():\n    pass\n",
    "def count_vowels": "".join(VOWEL_BODY),
    "larger of two": "def larger(a, b):\n    return a if a > b else b\n",
}


@pytest.mark.parametrize("name, path, kind", [
    ("humaneval", "mini_humaneval.jsonl", "generate"),
    ("humanevalfix", "mini_humanevalpack.jsonl", "fix"),
    ("mbpp", "mini_mbpp.jsonl", "generate"),
])
def test_right_answers_pass_and_wrong_ones_fail(name: str, path: str, kind: str) -> None:
    problems, _ = load_problems(name, DATA / path)
    assert {problem.kind for problem in problems} == {kind}
    right = evaluate(problems, pipeline(oracle(CANONICAL)), progress=False, limits=LIMITS)
    assert right.summary([1])["pass@1"] == 1.0, [s.stderr for s in right.samples]
    wrong = evaluate(problems, pipeline(oracle({})), progress=False, limits=LIMITS)
    assert wrong.summary([1])["pass@1"] == 0.0 and all(s.status == "failed" for s in wrong.samples)


def test_infilling_subsets_from_the_file_name() -> None:
    single, subset = load_problems("humaneval-infilling", DATA / "mini-SingleLineInfilling.jsonl.gz")
    assert subset == "single-line" and single[0].multiline is False
    # the model runs on past the hidden line: only the line is kept, and it ends with its newline
    backend = oracle({"def count_vowels": "".join(VOWEL_BODY[1:])})
    result = evaluate(single, pipeline(backend), progress=False, limits=LIMITS)
    assert result.samples[0].candidate == VOWEL_BODY[1] and result.samples[0].passed
    multi, subset = load_problems("humaneval-infilling", DATA / "mini-MultiLineInfilling.jsonl")
    assert subset == "multi-line" and multi[0].multiline
    backend = oracle({"def count_vowels": "".join(VOWEL_BODY[1:]) + "\n\nprint(count_vowels('a'))\n"})
    result = evaluate(multi, pipeline(backend), progress=False, limits=LIMITS)
    assert result.samples[0].candidate == "".join(VOWEL_BODY[1:4]) and result.samples[0].passed


def test_pass_at_k_over_several_samples() -> None:
    problems, _ = load_problems("humaneval", DATA / "mini_humaneval.jsonl", limit=1)
    replies = iter(["    return a + b\n", "    return a * b\n", "    return a - b\n"])
    backend = scripted.ScriptedBackend(lambda request: next(replies))
    result = evaluate(problems, pipeline(backend, temperature=0.8), n_samples=3, progress=False, limits=LIMITS)
    summary = result.summary([1, 2, 3])
    assert summary["samples_per_problem"] == 3 and summary["pass@1"] == pytest.approx(1 / 3)
    assert summary["pass@2"] == pytest.approx(2 / 3) and summary["pass@3"] == 1.0
    assert [request.seed for request in backend.requests] == [0, 1, 2]


def test_a_generation_error_is_recorded_not_fatal() -> None:
    def explode(request: CompletionRequest) -> str:
        raise RuntimeError("backend fell over")

    problems, _ = load_problems("humaneval", DATA / "mini_humaneval.jsonl")
    result = evaluate(problems, pipeline(scripted.ScriptedBackend(explode)), progress=False, limits=LIMITS)
    assert [s.status for s in result.samples] == ["error", "error"] and "fell over" in result.samples[0].error
    assert result.summary([1])["pass@1"] == 0.0 and result.summary([1])["errors"] == 2


def test_bad_data_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_problems("humaneval", tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="does not look like HumanEval"):
        load_problems("humaneval", DATA / "mini_mbpp.jsonl")
    (tmp_path / "odd.jsonl").write_text(json.dumps({"task_id": "x", "prompt": "", "suffix": "", "test": "",
                                                    "entry_point": "f"}) + "\n")
    with pytest.raises(DatasetError, match="--subset"):
        load_problems("humaneval-infilling", tmp_path / "odd.jsonl")


def test_cli_end_to_end_with_a_checkpoint(tiny_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from glm5_lsp.cli import main

    out = tmp_path / "report"
    code = main(["eval", "humaneval", "--data", str(DATA / "mini_humaneval.jsonl"), "--model", str(tiny_checkpoint),
                 "--max-tokens", "8", "--repair-rounds", "1", "--out", str(out), "--no-progress", *UNSAFE_FLAG])
    printed = capsys.readouterr().out
    assert code == 0 and "pass@1: 0.0000 (2 problems, 1 samples each)" in printed  # random weights pass nothing
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["problems"] == 2 and len(report["samples"]) == 2
    assert report["samples"][0]["status"] in {"failed", "timeout"} and (out / "report.md").read_text().startswith("| benchmark")
    assert main(["eval", "humaneval", "--data", str(DATA / "mini_humaneval.jsonl"), "--k", "5"]) == 2


def test_cli_refuses_to_run_candidates_unisolated_unless_told(tiny_checkpoint: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from glm5_lsp.cli import main
    from glm5_lsp.evaluate import sandbox

    monkeypatch.setattr(sandbox, "isolation_problem", lambda: "user namespaces are disabled here")
    command = ["eval", "humaneval", "--data", str(DATA / "mini_humaneval.jsonl"), "--model", str(tiny_checkpoint),
               "--max-tokens", "4", "--repair-rounds", "1", "--out", str(tmp_path / "report"), "--no-progress"]
    assert main(command) == 2
    refused = capsys.readouterr().err
    assert "cannot be isolated here (user namespaces are disabled here)" in refused and "--unsafe-no-sandbox" in refused
    assert not (tmp_path / "report").exists()
    with pytest.raises(sandbox.SandboxUnavailable):  # the library refuses the same way
        evaluate(load_problems("humaneval", DATA / "mini_humaneval.jsonl")[0], pipeline(oracle(CANONICAL)), progress=False)
    assert main([*command, "--unsafe-no-sandbox"]) == 0
    assert "warning: --unsafe-no-sandbox" in capsys.readouterr().err
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["sandbox"] == "unsafe-no-sandbox" and len(report["samples"]) == 2


REAL = [
    ("humaneval", "humaneval/HumanEval.jsonl.gz", None),
    ("humaneval-infilling", "humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz", "single-line"),
    ("humaneval-infilling", "humaneval-infilling/HumanEval-MultiLineInfilling.jsonl.gz", "multi-line"),
    ("humaneval-infilling", "humaneval-infilling/HumanEval-RandomSpanInfillingLight.jsonl.gz", "random-span"),
    ("humanevalfix", "humanevalpack/humanevalpack.jsonl", None),
    ("mbpp", "mbpp/mbpp.jsonl", None),
    ("mbpp", "mbpp/mbpp_sanitized_for_code_generation.jsonl", None),
]


@pytest.mark.parametrize("name, relative, subset", REAL, ids=[r[1].split("/")[-1] for r in REAL])
def test_real_canonical_solutions_pass_and_buggy_ones_fail(shared_benchmarks: Path, name: str, relative: str,
                                                           subset: str | None) -> None:
    from glm5_lsp.evaluate.datasets import read_jsonl

    path = shared_benchmarks / relative
    problems, found = load_problems(name, path, limit=2)
    assert found == subset
    for problem, record in zip(problems, read_jsonl(path)):
        if name == "humanevalfix":
            right, wrong = record["declaration"] + record["canonical_solution"], problem.code
        elif name == "mbpp" and "code" in record:
            right, wrong = record["code"], "def nothing():\n    pass\n"
        elif name == "mbpp":  # CodeT's solutions are indented by 2 under a 4-space docstring: re-indent
            right, wrong = textwrap.indent(textwrap.dedent(record["canonical_solution"]), "    "), "    return None\n"
        else:
            right, wrong = record["canonical_solution"], "    return None\n"
        assert run_program(problem.program(right), LIMITS).passed, problem.task_id
        assert not run_program(problem.program(wrong), LIMITS).passed, problem.task_id
