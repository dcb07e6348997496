"""Drift and the online update (issue 23, acceptance 4): shifted features are flagged past KL 0.1; the
training command updates the booster from the acceptance log and keeps the old one when the new one is
worse on held-out data (``glm5_lsp.gate.drift``, ``glm5_lsp.gate.train.update_quality``)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import gate_data
import pytest

from glm5_lsp.cli import main
from glm5_lsp.gate.acceptance import AcceptanceLog
from glm5_lsp.gate.booster import Gate
from glm5_lsp.gate.drift import KL_LIMIT, MIN_SAMPLES, DriftMonitor, Histogram, kl_divergence
from glm5_lsp.gate.train import train_gate, update_quality


def test_histograms_bin_by_training_quantiles_with_a_bin_for_missing() -> None:
    values = [float(v) for v in range(100)] + [None] * 10
    hist = Histogram.fit(values)
    assert hist.size == len(hist.edges) + 2 and sum(hist.counts) == 110
    assert hist.counts[-1] == 10  # the missing values' bin
    assert max(hist.counts[:-1]) - min(hist.counts[:-1]) <= 1  # quantile bins hold about as many each
    assert hist.bin(-5.0) == 0 and hist.bin(1e9) == hist.size - 2 and hist.bin(float("nan")) == hist.size - 1
    codes = Histogram.fit([0.0, 1.0, 1.0, 2.0], categorical=True)
    assert codes.counts == [1, 2, 1, 0, 0] and codes.bin(7.0) == 3  # an unseen category
    assert Histogram.from_json(hist.to_json()) == hist


def test_kl_divergence() -> None:
    assert kl_divergence([10, 20, 30], [1, 2, 3], smoothing=0) == pytest.approx(0.0, abs=1e-12)
    p, q = [90.0, 10.0], [50.0, 50.0]
    expected = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert kl_divergence(p, q, smoothing=0) == pytest.approx(expected)


@pytest.fixture(scope="module")
def gate() -> Gate:
    gate, _ = train_gate(gate_data.rows(600, seed=4))
    return gate


def test_shifted_features_are_flagged_past_the_limit(gate: Gate) -> None:
    rng = random.Random(5)
    same = DriftMonitor.from_meta(gate.meta)
    for _ in range(MIN_SAMPLES - 1):
        same.add(gate_data.features(rng))
    assert not same.report().judged and not same.report().flagged  # too few to judge
    for _ in range(800):
        same.add(gate_data.features(rng))
    report = same.report()
    assert report.judged and not report.flagged, report.summary()
    assert report.worst[1] < KL_LIMIT

    shifted = DriftMonitor.from_meta(gate.meta)
    for _ in range(1000):
        shifted.add(gate_data.features(rng, shift=1.5))  # a new model: more confident, log-probs moved
    report = shifted.report()
    assert report.flagged and report.drifted[0] == "lp_mean"
    assert report.divergences["lp_mean"] > KL_LIMIT
    assert report.divergences["cursor_column"] < KL_LIMIT  # what did not move is not flagged
    assert "past KL 0.1" in report.summary()


def test_running_histograms_forget_the_old_distribution(gate: Gate) -> None:
    rng = random.Random(6)
    monitor = DriftMonitor.from_meta(gate.meta, half_life=200)
    for _ in range(1500):
        monitor.add(gate_data.features(rng, shift=1.5))
    assert monitor.report().flagged
    for _ in range(3000):
        monitor.add(gate_data.features(rng))
    assert not monitor.report().flagged
    assert monitor.samples == pytest.approx(200 / math.log(2), rel=0.05)  # the effective window


def _log_outcomes(path: Path, rows: list[dict], start: float = 1000.0) -> None:
    """Each row's candidate shown, then accepted and kept, or ignored, by its label."""
    clock = [start]
    log = AcceptanceLog(path, clock=lambda: clock[0])
    for number, row in enumerate(rows):
        key = f"s{number}"
        log.shown(key, features=row["single"]["features"], score=0.5, threshold=0.3, text="lue", language="python")
        if row["single"]["exact"]:
            clock[0] += 1
            log.accepted(key)
        clock[0] += 2
    clock[0] += 100
    log.shown("last", features={}, score=None, threshold=None, text="x", language="python")


def _gate_files(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.glob("*.txt")}


def test_the_training_command_updates_from_the_log_and_keeps_the_old_booster_when_worse(
        gate: Gate, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = gate.save(tmp_path / "gate")
    model = ["--model", str(tmp_path), "--out", str(folder)]
    # The model changed: exactness now follows another feature. The newest quarter (held out) too.
    changed = gate_data.rows(900, seed=7, relation="cursor_column")
    _log_outcomes(tmp_path / "better.jsonl", changed)
    before = _gate_files(folder)
    assert main(["gate", "train", "--log", str(tmp_path / "better.jsonl"), *model]) == 0
    out = capsys.readouterr().out
    assert "no worse" in out and "900 outcomes" in out
    after = _gate_files(folder)
    assert after["quality.txt"] != before["quality.txt"]
    updated = Gate.load(folder)
    # every booster of the averaged head went on, each from its own trees
    assert len(updated.quality.boosters) == len(gate.quality.boosters) > 1
    assert all(after[f] != before[f] for f in before if f.startswith("quality"))
    assert all(new.num_trees() > old.num_trees() for new, old in zip(updated.quality.boosters, gate.quality.boosters))
    assert updated.meta["updates"][-1]["auc_after"]["local held out"] > updated.meta["updates"][-1]["auc_before"]["local held out"]

    # Local data that does not hold up: trained on one relation, held out on the old one.
    misleading = gate_data.rows(700, seed=8, relation="cursor_column") + gate_data.rows(300, seed=9)
    _log_outcomes(tmp_path / "worse.jsonl", misleading)
    assert main(["gate", "train", "--log", str(tmp_path / "worse.jsonl"), *model]) == 0
    out = capsys.readouterr().out
    assert "worse on local held out" in out and "kept the current booster" in out
    assert _gate_files(folder) == after  # the old booster stays, byte for byte


def test_too_little_local_data_changes_nothing(gate: Gate) -> None:
    result = update_quality(gate, [({"lp_mean": -1.0}, True)] * 30)
    assert not result.kept_new and "too little" in result.reason and result.gate is gate


def test_the_drift_command_reads_the_log(gate: Gate, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = gate.save(tmp_path / "gate")
    _log_outcomes(tmp_path / "same.jsonl", gate_data.rows(400, seed=10))
    assert main(["gate", "drift", "--log", str(tmp_path / "same.jsonl"), "--gate", str(folder),
                 "--model", str(tmp_path)]) == 0
    assert "none past KL 0.1" in capsys.readouterr().out
    _log_outcomes(tmp_path / "moved.jsonl", gate_data.rows(400, seed=11, shift=2.0))
    assert main(["gate", "drift", "--log", str(tmp_path / "moved.jsonl"), "--gate", str(folder),
                 "--model", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "needs retraining" in out and "lp_mean" in out
    assert json.loads((folder / "gate.json").read_text())["histograms"]["lp_mean"]["counts"]


def test_the_stability_check_holds_an_update_to_the_training_rows_until_the_features_move(
        gate: Gate, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Kept beside the gate, the training rows stop an update that forgets them, unless the model's
    candidates no longer look like them (drift past KL 0.1): then they are out of date."""
    checks = gate_data.rows(300, seed=30)
    gate.checks = [(r["single"]["features"], bool(r["single"]["exact"])) for r in checks if r["single"]["shown"]]
    folder = gate.save(tmp_path / "gate")
    gate.checks = []
    args = ["--model", str(tmp_path), "--out", str(folder)]
    changed = gate_data.rows(900, seed=7, relation="cursor_column")  # same features, another relation
    _log_outcomes(tmp_path / "changed.jsonl", changed)
    before = _gate_files(folder)
    assert main(["gate", "train", "--log", str(tmp_path / "changed.jsonl"), *args]) == 0
    out = capsys.readouterr().out
    assert "worse on training check" in out and _gate_files(folder) == before
    moved = gate_data.rows(900, seed=7, relation="cursor_column", shift=1.5)  # and the features moved
    _log_outcomes(tmp_path / "moved.jsonl", moved)
    assert main(["gate", "train", "--log", str(tmp_path / "moved.jsonl"), *args]) == 0
    out = capsys.readouterr().out
    assert "features drifted" in out and "no worse" in out and _gate_files(folder) != before


def test_an_update_learns_from_this_models_suggestions_and_becomes_its_gate(
        gate: Gate, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from glm5_lsp.gate.booster import model_fingerprint

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"new weights" * 50)
    folder = gate.save(model / "gate")  # trained for other weights (no fingerprint of these)
    rows = gate_data.rows(900, seed=7, relation="cursor_column")
    clock = [1000.0]
    log = AcceptanceLog(tmp_path / "log.jsonl", clock=lambda: clock[0])
    for number, row in enumerate(rows):
        for owner in ("other-model", model_fingerprint(model)):  # the same outcomes under two models
            key = f"{owner}{number}"
            log.shown(key, features=row["single"]["features"], score=0.5, threshold=0.3, text="x", language="python",
                      model=owner)
            if row["single"]["exact"]:
                log.accepted(key)
        clock[0] += 2
    clock[0] += 100
    log.shown("last", features={}, score=None, threshold=None, text="x", language="python", model="other-model")
    assert main(["gate", "train", "--log", str(tmp_path / "log.jsonl"), "--model", str(model)]) == 0
    out = capsys.readouterr().out
    assert "900 outcomes" in out and "no worse" in out  # the other model's 900 left out
    updated = Gate.load(folder, model)
    assert updated.meta["model_fingerprint"] == model_fingerprint(model) and not updated.stale
