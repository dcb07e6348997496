"""The repair loop and the decoding monitor on the real runtime (a random tiny checkpoint made by
the ``tiny_checkpoint`` fixture): the monitor's invariant holds under sampling, the loop returns only
clean candidates, and ``benchmarks/repair.py`` runs end to end."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from glm5_lsp.backends.base import CompletionRequest
from glm5_lsp.backends.local import LocalBackend
from glm5_lsp.repair.loop import LoopTask, RepairSettings, RepairTarget
from glm5_lsp.repair.monitor import JediAttributes, MonitorSettings, python_monitor_factory
from glm5_lsp.repair.standard import standard_loop
from glm5_lsp.spans import Prompt

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend(tiny_checkpoint: Path) -> LocalBackend:
    local = LocalBackend(tiny_checkpoint)
    local.load()
    return local


@pytest.mark.parametrize("context", ["import os\n\nvalue = os.", "items = []\nitems.", "text = 'a'\ntext.st"])
def test_sampled_attributes_are_always_valid_with_the_monitor(backend: LocalBackend, context: str) -> None:
    valid = JediAttributes()(context[: context.rindex(".") + 1])
    assert valid
    # (a cold jedi lookup may take longer than a request's provider time, which would leave it unchecked)
    factory = python_monitor_factory(backend.tokenizer.token_strings(), MonitorSettings(provider_seconds=60.0))
    target = RepairTarget(context, len(context), len(context), "", "python")
    typed = context[context.rindex(".") + 1:]
    for seed in range(2):
        request = CompletionRequest(Prompt(context), max_tokens=6, temperature=1.5, seed=seed,
                                    logits_processor=factory(target), use_attention_policy=False)
        text = backend.complete(request).text
        name = typed + re.match(r"[A-Za-z0-9_]*", text).group()  # type: ignore[union-attr]
        finished = len(name) - len(typed) < len(text)
        if finished:
            assert name in valid, (context, text)
        else:
            assert any(v.startswith(name) for v in valid), (context, text)


def test_the_loop_on_the_runtime_returns_only_clean_candidates(backend: LocalBackend) -> None:
    document = "def double(x):\n    return \n"
    at = document.index("return ") + len("return ")
    loop = standard_loop(backend, RepairSettings(max_rounds=2, time_budget_s=60),
                         token_strings=backend.tokenizer.token_strings())
    result = loop.run(CompletionRequest(Prompt(document[:at], document[at:]), max_tokens=8),
                      RepairTarget(document, at, at, "d.py", "python"),
                      LoopTask(postprocess=lambda text: text.split("\n")[0]))
    assert 1 <= result.rounds <= 2 and result.candidates_tried == len(result.candidates) == result.rounds
    assert result.tokens > 0 and result.seconds > 0
    if result.text is None:
        assert not result.clean and all(c.blocking or not c.text.strip() for c in result.candidates)
    else:
        assert result.clean and result.diagnostics_after == [] or not result.diagnostics_after
        compile(document[:at] + result.text + document[at:], "d.py", "exec")


def test_benchmark_runs_end_to_end(tiny_checkpoint: Path, shared_benchmarks: Path, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "repair.py"
    spec = importlib.util.spec_from_file_location("bench_repair", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["bench_repair"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        del sys.modules["bench_repair"]
    out = tmp_path / "results.json"
    code = module.main(["--model", str(tiny_checkpoint), "--limit", "1", "--max-tokens", "8", "--rounds", "2",
                        "--datasets", "fix",
                        "--configs", "plain,loop+monitor", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "HumanEvalFix (Python): 1 tasks" in printed and "loop+monitor" in printed
    assert '"results"' in out.read_text()
