"""The gate shipped beside the embedded model (``glm5_lsp/weights/glm5-code-tiny/gate``) loads, never saw
the REPORT packages, and judges a candidate within its budget.

Skips while no gate is shipped. When the weights change (``scripts/cpu_train.sh --promote``), the gate
is stale (trained for other weights): it still decides, with a warning, and its features' drift is
watched; retrain it on BENCHMARK_FIT (BENCHMARKS.md, "The gate", has the commands)."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from glm5_lsp.gate.booster import LENGTH_OPTIONS, STRATEGIES, Gate, default_gate_dir, model_fingerprint
from glm5_lsp.gate.features import FEATURES, features, request_info
from glm5_lsp.gate.judge import CompletionGate
from glm5_lsp.model import default_model_path
from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT


@pytest.fixture(scope="module")
def gate() -> Gate:
    model = default_model_path()
    folder = default_gate_dir(model)
    if not (folder / "gate.json").is_file():
        pytest.skip("no gate is shipped with the embedded model")
    return Gate.load(folder, model)


def test_the_shipped_gate_never_saw_the_report_packages_and_decides_even_when_stale(
        gate: Gate, caplog: pytest.LogCaptureFixture) -> None:
    model = default_model_path()
    assert gate.stale == (model_fingerprint(model) != gate.meta["model_fingerprint"])
    with caplog.at_level(logging.WARNING):
        judge = CompletionGate.for_model(model)
    assert judge.gate is not None and judge.threshold == gate.threshold
    assert ("trained for other weights" in caplog.text) == gate.stale
    document = "x = 1\nresult = x"
    result = SimpleNamespace(text=" + 1", rounds=1, finish_reason="stop", finished_word=False, clean=True,
                             prompt_tokens=30, completion_tokens=2)
    verdict = judge.judge(result, document, len(document), language="python", multiline=False)
    assert verdict.score is not None and verdict.show == (verdict.score >= judge.threshold)
    packages = set(gate.meta["training"]["packages"])
    assert packages <= set(BENCHMARK_FIT) and not packages & set(BENCHMARK_REPORT)
    assert 0 < gate.threshold < 1
    assert set(gate.quality.features) <= set(FEATURES)
    assert gate.length_head is None or gate.length_head.classes == list(LENGTH_OPTIONS)
    assert gate.strategy_head is None or gate.strategy_head.classes == list(STRATEGIES)
    assert gate.checks, "the stability check rows of an online update"


def test_the_shipped_gate_prefers_a_completed_known_line(gate: Gate) -> None:
    document = "def f(x):\n    if x:\n        return 1\n    el"
    info = request_info(document, len(document), language="python", multiline=False)
    result = SimpleNamespace(text="se:", rounds=1, finish_reason="stop", finished_word=True, clean=True,
                             prompt_tokens=30, completion_tokens=2)
    good = gate.score(features(result, info))
    junk = gate.score(features(SimpleNamespace(**{**vars(result), "text": "se_thing(a, ", "finished_word": False}),
                               info))
    assert not math.isnan(good) and good > junk
