"""The gate wired into the pipeline (issue 23): ``Pipeline.complete(gated=True)`` judges the checked
candidate, returns nothing (explained) below ``completion.minQuality``, follows the strategy head after a
rejected one, copes with a served model's missing features, and a gate trained for other weights (stale)
still decides."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import math
import shutil
from pathlib import Path

import gate_data
import pytest

from glm5_lsp.gate.booster import Gate, load_gate
from glm5_lsp.gate.judge import CompletionGate
from glm5_lsp.gate.train import train_gate
from glm5_lsp.pipeline import Pipeline, PipelineSettings, RepairSettings

_spec = importlib.util.spec_from_file_location(
    "scripted_backend", Path(__file__).parent / "data" / "batch" / "scripted_backend.py")
assert _spec and _spec.loader
scripted = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scripted)

SHIPPED = Path(__file__).resolve().parents[1] / "glm5_lsp" / "weights" / "glm5-code-tiny"
DOCUMENT = "value = 41\ntotal = 0\nresult = va"


@pytest.fixture(scope="module")
def gate() -> Gate:
    return train_gate(gate_data.rows(600, seed=23))[0]


def _pipeline(answer: str, gate: CompletionGate | None) -> Pipeline:
    pipeline = Pipeline(scripted.ScriptedBackend(answer), PipelineSettings(max_tokens=8))
    if gate is not None:
        pipeline.install_gate(gate)
    return pipeline


def test_below_min_quality_nothing_is_shown_and_the_result_says_why(gate: Gate) -> None:
    judge = CompletionGate(gate, min_quality=1.0)  # nothing scores 1.0
    judge.gate.strategy_head = None  # no strategy head: silent
    pipeline = _pipeline("lue + 1", judge)
    out = pipeline.complete(DOCUMENT, len(DOCUMENT), path="m.py", gated=True, trigger="automatic")
    assert out.clean and out.text == ""
    assert "completion.minQuality 1.000" in out.withheld and "silent" in out.withheld
    assert out.score is not None and 0.0 <= out.score < 1.0
    assert out.features["cursor_column"] == len("result = va")
    # the same request, not gated (a command, batch): the checked candidate as before
    plain = pipeline.complete(DOCUMENT, len(DOCUMENT), path="m.py")
    assert plain.text == "lue + 1" and plain.score is None and plain.withheld == ""


def test_at_or_above_min_quality_the_candidate_is_shown_with_its_score(gate: Gate) -> None:
    pipeline = _pipeline("lue + 1", CompletionGate(gate, min_quality=0.0))
    out = pipeline.complete(DOCUMENT, len(DOCUMENT), path="m.py", gated=True)
    assert out.text == "lue + 1" and out.withheld == "" and 0.0 <= out.score <= 1.0
    # a served model gives no log-probabilities: those features are missing, the gate still scores
    assert math.isnan(out.features["lp_mean"]) and math.isnan(out.features["steps"])


def test_a_pipeline_without_a_gate_shows_everything_when_gated() -> None:
    out = _pipeline("lue + 1", None).complete(DOCUMENT, len(DOCUMENT), path="m.py", gated=True)
    assert out.text == "lue + 1" and out.score is None
    empty_gate = _pipeline("lue + 1", CompletionGate(None)).complete(DOCUMENT, len(DOCUMENT), path="m.py", gated=True)
    assert empty_gate.text == "lue + 1" and empty_gate.score is None


def test_an_unclean_candidate_is_not_judged(gate: Gate) -> None:
    pipeline = Pipeline(scripted.ScriptedBackend("lue +"),
                        PipelineSettings(max_tokens=8, truncations=0, repair=RepairSettings(max_rounds=1)))
    pipeline.install_gate(CompletionGate(gate, min_quality=0.0))
    out = pipeline.complete(DOCUMENT, len(DOCUMENT), path="m.py", gated=True)
    assert not out.clean and out.score is None and out.features == {}


@pytest.mark.parametrize("strategy", ["finish_word", "silent", "regenerate"])
def test_after_a_rejected_candidate_the_strategy_head_decides(gate: Gate, strategy: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    judge = CompletionGate(gate, min_quality=1.0)
    monkeypatch.setattr(judge.gate, "strategy", lambda values: strategy)
    backend = scripted.ScriptedBackend("lue + 1")  # clean, rejected by the gate
    pipeline = Pipeline(backend, PipelineSettings(max_tokens=8))
    pipeline.install_gate(judge)
    out = pipeline.complete(DOCUMENT, len(DOCUMENT), path="m.py", gated=True)
    assert len(backend.requests) == 1, "no second generation after a rejected candidate"
    if strategy == "finish_word":  # the word finisher's likeliest word, checked: ``value``
        assert out.text == "lue" and out.finished_word and out.withheld == ""
        assert out.features["finished_word"] == 1.0 and out.score is not None
    else:
        assert out.text == "" and strategy in out.withheld
        if strategy == "regenerate":
            assert "not run" in out.withheld


def test_a_finished_word_that_ends_a_block_header_gets_its_colon(gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    judge = CompletionGate(gate, min_quality=1.0)
    monkeypatch.setattr(judge.gate, "strategy", lambda values: "finish_word")
    document = "value = 41\nif va\n    print(value)\n"  # the body below: the header needs its colon
    at = document.index("va\n") + 2
    out = _pipeline("lue + 1", judge).complete(document, at, path="m.py", gated=True)
    assert out.text == "lue:" and out.finished_word


@pytest.mark.parametrize("strategy", ["finish_word", "silent"])
def test_a_keyword_the_model_left_to_the_finisher_is_shown_after_the_gate(
        gate: Gate, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing the model wrote was clean, so the repair loop's answer is already the typed word
    finished. The quality head, which scores whole lines, rejects a word alone. A keyword the line's
    syntax asks for (``from os im`` -> ``import``) is shown all the same; any other word only where
    the memory's continuation begins with it (here there is no memory), not on the strategy head's
    word alone."""
    judge = CompletionGate(gate, min_quality=1.0)
    monkeypatch.setattr(judge.gate, "strategy", lambda values: strategy)
    settings = PipelineSettings(max_tokens=8, repair=RepairSettings(max_rounds=1))
    document = "import sys\nfrom os im"
    keyword = Pipeline(scripted.ScriptedBackend("port $$"), settings)  # no cut of it is clean
    keyword.install_gate(judge)
    out = keyword.complete(document, len(document), path="m.py", gated=True)
    assert out.text == "port" and out.finished_word and out.withheld == ""
    assert out.score is not None and out.features["finished_word"] == 1.0
    name = Pipeline(scripted.ScriptedBackend("luex y z"), settings)  # ``valuex`` is unbound: finished ``value``
    name.install_gate(judge)
    out = name.complete(DOCUMENT, len(DOCUMENT), path="m.py", gated=True)
    assert out.text == "" and strategy in out.withheld


def test_finishing_the_word_stays_silent_when_nothing_finishes_it(gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
    judge = CompletionGate(gate, min_quality=1.0)
    monkeypatch.setattr(judge.gate, "strategy", lambda values: "finish_word")
    document = "zq = 1\nresult = zq"  # nothing in scope finishes ``zq``
    out = _pipeline(" + 1", judge).complete(document, len(document), path="m.py", gated=True)
    assert out.text == "" and "no clean finished word" in out.withheld


def test_the_shipped_gate_judges_a_local_model_and_reads_its_generation(tiny_checkpoint: Path, tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A gate trained for other weights (the shipped one copied beside a tiny random checkpoint: what
    promoting new weights does) still decides, with a warning; it reads the generation's numbers."""
    from glm5_lsp.pipeline.session import open_session

    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, model)
    shutil.copytree(SHIPPED / "gate", model / "gate")
    with caplog.at_level(logging.WARNING):
        session = open_session("local", {"model_path": str(model)},
                               PipelineSettings(max_tokens=4, repair=RepairSettings(return_unclean=True)),
                               gate=True, min_quality=0.0)
    judge = session.pipeline.gate
    assert judge is not None and judge.gate is not None and judge.gate.stale
    assert "trained for other weights" in caplog.text
    assert not judge.wants_internals, "the shipped heads read no runtime internals: none are asked for"
    document = "count = 1\ntotal = co"
    out = session.pipeline.complete(document, len(document), path="m.py", gated=True, trigger="automatic")
    if not out.text.strip():
        pytest.skip("the random tiny model wrote nothing to judge")
    assert out.score is not None and out.features["steps"] >= 1 and out.features["healed_chars"] == 2
    assert judge.drift is not None and judge.drift.samples > 0
    threshold = load_gate(model).threshold
    assert CompletionGate.for_model(model).threshold == threshold  # the setting unset: gate.json's


def test_a_served_model_gets_no_gate_unless_one_is_named(tmp_path: Path) -> None:
    from glm5_lsp.pipeline.session import open_session

    session = open_session("openai", {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, PipelineSettings(),
                           gate=True)
    assert session.pipeline.gate is not None and session.pipeline.gate.gate is None
    named = open_session("openai", {"base_url": "http://127.0.0.1:9/v1", "model": "m"}, PipelineSettings(),
                         gate=True, gate_path=str(SHIPPED / "gate"))
    assert named.pipeline.gate.gate is not None and named.pipeline.gate.recorder is None


def _reading(gate: Gate, name: str) -> Gate:
    """``gate`` with its quality head's last input read from feature ``name`` instead."""
    return dataclasses.replace(gate, quality=dataclasses.replace(gate.quality,
                                                                 features=[*gate.quality.features[:-1], name]))


def test_a_gate_reading_internals_says_so(gate: Gate) -> None:
    assert not CompletionGate(gate).wants_internals
    assert CompletionGate(_reading(gate, "moe_router_entropy_mean")).wants_internals


def test_a_gate_reading_internals_gets_them_from_the_runtime(gate: Gate, tiny_checkpoint: Path) -> None:
    from glm5_lsp.backends.local import LocalBackend

    backend = LocalBackend(tiny_checkpoint)
    asked: list[bool] = []
    complete = backend.complete
    backend.complete = lambda request: (asked.append(request.step_stats), complete(request))[1]
    pipeline = Pipeline(backend, PipelineSettings(max_tokens=4, repair=RepairSettings(return_unclean=True)))
    pipeline.install_gate(CompletionGate(_reading(gate, "hidden_norm_mean"), min_quality=0.0))
    document = "count = 1\ntotal = co"
    out = pipeline.complete(document, len(document), path="m.py", gated=True)
    assert asked and all(asked), "the backend is asked for its internals"
    if not out.text.strip():
        pytest.skip("the random tiny model wrote nothing to judge")
    assert math.isfinite(out.features["hidden_norm_mean"]) and out.features["hidden_norm_mean"] > 0
    asked.clear()
    pipeline.complete(document, len(document), path="m.py")  # not gated: not asked
    assert asked and not any(asked)


class _ShowsOnlyStandIns:
    """A gate that withholds what the model wrote and shows whatever stands in for it."""

    threshold = 0.5
    wants_internals = False

    def judge(self, result, *args, generated: bool = True, **kwargs):
        from types import SimpleNamespace

        return SimpleNamespace(show=not generated, score=0.0 if generated else 0.9, features={}, text=result.text,
                               strategy="silent")


@pytest.mark.parametrize(("remembered", "line", "shown"), [
    ("gu", "", ""),  # stops inside the word the model wrote on: ``argu`` for ``argument(``
    ("gu", "argument(", ""),  # ... or the workspace's lines do
    ("gument", "", "gument"),  # a whole word the model's line goes on from: it may stand in
    ("gument(", "argu", "gument("),
])
def test_the_memorys_continuation_never_stands_in_cut_inside_a_word(remembered: str, line: str, shown: str) -> None:
    from glm5_lsp.pipeline import PipelineResult
    from glm5_lsp.pipeline.gating import judged
    from glm5_lsp.pipeline.memory import Recollection

    document = "@ar\ndef f():\n    pass\n"
    rejected = "gument(x)" if line == "argu" else "gument("
    result = PipelineResult(rejected, True, recalled=Recollection("ar" + remembered, line, 1, 1, 1))
    out = judged(_ShowsOnlyStandIns(), result, document, 3, language="python", multiline=False, trigger=None,
                 finish=lambda: "", heal="ar", remembered=lambda shown: remembered)
    assert out.text == shown
    assert out.remembered == bool(shown)
