"""The gate as a front end wires it: no gate shows everything; a gate shows what scores above the
threshold, cuts a multi-line candidate to its length head's choice, says what to do after a rejected
one, and counts features for drift (``glm5_lsp.gate.judge``)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import gate_data
import pytest

from glm5_lsp.gate.booster import STRATEGIES, Gate
from glm5_lsp.gate.judge import CompletionGate
from glm5_lsp.gate.train import train_gate


@pytest.fixture(scope="module")
def gate() -> Gate:
    return train_gate(gate_data.rows(600, seed=20))[0]


def result(text: str) -> SimpleNamespace:
    return SimpleNamespace(text=text, rounds=1, finish_reason="stop", finished_word=False, clean=True,
                           prompt_tokens=50, completion_tokens=3)


def test_without_a_gate_every_candidate_is_shown(tmp_path: Path) -> None:
    judge = CompletionGate.for_model(tmp_path)  # no gate beside this "model"
    verdict = judge.judge(result("lue)"), "x = va", 6, language="python", multiline=False)
    assert verdict.show and verdict.text == "lue)" and verdict.score is None
    assert not judge.judge(result(""), "x = va", 6, language="python", multiline=False).show


def test_a_broken_gate_is_left_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "gate.json").write_text("{")
    judge = CompletionGate.for_model(tmp_path)
    assert judge.gate is None and "gate is off" in caplog.text


def test_the_threshold_decides_and_a_rejected_candidate_gets_a_strategy(gate: Gate) -> None:
    always = CompletionGate(gate, min_quality=0.0)
    never = CompletionGate(gate, min_quality=1.0)
    document = "import os\nx = os.pa"
    shown = always.judge(result("th.join(a, b)"), document, len(document), language="python", multiline=False)
    assert shown.show and 0 <= shown.score <= 1 and shown.features["cursor_column"] == len("x = os.pa")
    hidden = never.judge(result("th.join(a, b)"), document, len(document), language="python", multiline=False)
    assert not hidden.show and hidden.text == "" and hidden.strategy in STRATEGIES
    assert CompletionGate(gate).threshold == gate.threshold
    assert always.drift is not None and always.drift.samples == pytest.approx(1.0)


def test_a_multi_line_candidate_is_cut_to_the_length_heads_choice_only_when_asked(gate: Gate) -> None:
    document = "def f(x):\n    "
    text = "y = x + 1\n    z = y * 2\n    w = z\n    return w"
    # by default the fixed multi-line policy stands (the head measured no better): the whole block
    kept = CompletionGate(gate, min_quality=0.0).judge(result(text), document, len(document), language="python",
                                                       multiline=True)
    assert kept.show and kept.text == text and kept.length is None
    judge = CompletionGate(gate, min_quality=0.0, use_length=True)
    verdict = judge.judge(result(text), document, len(document), language="python", multiline=True)
    assert verdict.length in ("line", "lines2", "lines3", "block")
    assert text.startswith(verdict.text) and verdict.text


def test_installed_on_a_pipeline_the_gate_reads_the_generation(gate: Gate, tiny_checkpoint: Path) -> None:
    from glm5_lsp.backends.local import LocalBackend
    from glm5_lsp.pipeline import Pipeline, PipelineSettings
    from glm5_lsp.repair.loop import RepairSettings

    pipeline = Pipeline(LocalBackend(tiny_checkpoint),
                        PipelineSettings(max_tokens=4, repair=RepairSettings(return_unclean=True)))
    judge = CompletionGate(gate, min_quality=0.0)
    judge.install(pipeline)
    document = "count = 1\ntotal = co"
    judge.begin()
    out = pipeline.complete(document, len(document))
    if not out.text.strip():
        pytest.skip("the random tiny model wrote nothing to judge")
    verdict = judge.judge(out, document, len(document), language="python", multiline=False)
    assert verdict.features["steps"] >= 1 and verdict.features["healed_chars"] == 2
