"""``glm5-lsp gate``: train from rows into a gate folder, refuse the report packages, show, clear errors
(``glm5_lsp.gate.command``). The drift and update commands are tested in ``test_gate_drift.py``."""

from __future__ import annotations

import json
from pathlib import Path

import gate_data
import pytest

from glm5_lsp.cli import main
from glm5_lsp.gate.booster import Gate
from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    return folder


def test_train_writes_the_gate_beside_the_model(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _write(tmp_path / "rows.jsonl", gate_data.rows(500, seed=12))
    assert main(["gate", "train", "--data", str(data), "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert "ROC AUC" in out and "completion.minQuality" in out
    gate = Gate.load(model / "gate", model)
    assert not gate.stale and gate.checks and sum(y for _, y in gate.checks) > 0
    assert gate.meta["training"]["packages"] == sorted(BENCHMARK_FIT)
    assert main(["gate", "show", "--model", str(model)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["threshold"] == gate.threshold and shown["heads"]["quality"] == len(gate.quality.features)


def test_train_refuses_the_report_packages(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = gate_data.rows(300, seed=13) + gate_data.rows(50, seed=14, packages=BENCHMARK_REPORT[:1])
    data = _write(tmp_path / "rows.jsonl", rows)
    assert main(["gate", "train", "--data", str(data), "--model", str(model)]) == 2
    assert BENCHMARK_REPORT[0] in capsys.readouterr().err
    assert not (model / "gate").exists()


def test_bad_input_is_a_clear_error(tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(gate_data.rows(1)[0]) + "\n{not json\n")
    assert main(["gate", "train", "--data", str(data), "--model", str(model)]) == 1
    assert "rows.jsonl:2: not JSON" in capsys.readouterr().err
    assert main(["gate", "train", "--model", str(model)]) == 2
    assert "nothing to train from" in capsys.readouterr().err
    assert main(["gate", "show", "--model", str(model)]) == 1
    assert "no gate in" in capsys.readouterr().err
    assert main(["gate", "collect", "--packages", "no-such-distribution-here", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "not installed" in capsys.readouterr().err
