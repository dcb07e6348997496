"""The gate's boosters: trained on rows, saved as LightGBM text beside the model, loaded back, scored
with features missing; the threshold and the metrics it is chosen by (``glm5_lsp.gate``).

Rows are synthetic (``tests/gate_data.py``): exactness follows ``lp_mean``."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import gate_data
import pytest

from glm5_lsp.gate.booster import (
    LENGTH_OPTIONS,
    STRATEGIES,
    Gate,
    GateError,
    Head,
    load_gate,
    model_fingerprint,
)
from glm5_lsp.gate.train import SEEDS, best_threshold, grouped_folds, roc_auc, train_gate


@pytest.fixture(scope="module")
def trained() -> tuple[Gate, object, list[dict]]:
    rows = gate_data.rows(700, seed=1)
    gate, report = train_gate(rows)
    return gate, report, rows


def _brute_auc(scores: list[float], labels: list[bool]) -> float:
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_roc_auc_counts_pairs_and_ties() -> None:
    rng = random.Random(3)
    for _ in range(20):
        scores = [round(rng.random(), 1) for _ in range(30)]  # many ties
        labels = [rng.random() < 0.4 for _ in range(30)]
        if any(labels) and not all(labels):
            assert roc_auc(scores, labels) == pytest.approx(_brute_auc(scores, labels))
    assert math.isnan(roc_auc([0.1, 0.2], [True, True]))


def test_the_threshold_maximises_f1_and_keeps_equal_scores_together() -> None:
    scores = [0.9, 0.8, 0.8, 0.3, 0.2, 0.1]
    labels = [True, True, False, True, False, False]
    threshold, at = best_threshold(scores, labels)
    best = max(((t, sum(1 for s, y in zip(scores, labels) if s >= t and y), sum(1 for s in scores if s >= t))
                for t in set(scores)), key=lambda x: (2 * x[1] / (x[2] + 3), -x[0]))
    assert threshold == best[0] == 0.3
    assert at["precision"] == pytest.approx(3 / 4) and at["recall"] == 1.0


def test_a_precision_floor_chooses_the_lowest_threshold_that_keeps_it() -> None:
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
    labels = [True, True, False, True, False, True, False, False]
    # precision from the top: 1, 1, 2/3, 3/4, 3/5, 4/6, 4/7, 4/8
    threshold, at = best_threshold(scores, labels, min_precision=0.65)
    assert threshold == 0.4 and at["precision"] == pytest.approx(4 / 6) and at["recall"] == 1.0
    assert best_threshold(scores, labels, min_precision=0.75)[0] == 0.6
    assert best_threshold(scores, labels, min_precision=1.01) == best_threshold(scores, labels)  # none reaches it


def test_folds_keep_each_package_whole() -> None:
    groups = [f"p{i % 7}" for i in range(70)]
    folds = grouped_folds(groups, folds=5)
    assert sorted(i for fold in folds for i in fold) == list(range(70))
    for fold in folds:
        held = {groups[i] for i in fold}
        assert not held & {groups[i] for other in folds if other is not fold for i in other}


def test_training_finds_the_signal_out_of_fold(trained) -> None:
    gate, report, rows = trained
    assert report.oof_auc > 0.8  # packages held out: the relation is learnt, not the rows
    assert 0 < gate.threshold < 1
    assert "lp_mean" in gate.quality.features and "line_count" not in gate.quality.features
    confident = dict(rows[0]["single"]["features"], lp_mean=-0.5, end_prob_after=0.9)
    unsure = dict(confident, lp_mean=-6.0, end_prob_after=0.05)
    assert gate.score(confident) > gate.threshold > gate.score(unsure)
    assert gate.shows(confident) and not gate.shows(unsure)


def test_missing_features_are_scored_as_missing(trained) -> None:
    """A served model gives no log-probabilities: the same gate still scores its candidates."""
    gate, _, rows = trained
    values = dict(rows[0]["single"]["features"])
    served = {k: v for k, v in values.items() if k not in ("lp_mean", "top_mean", "end_prob_after")}
    assert 0.0 <= gate.score(served) <= 1.0
    assert 0.0 <= gate.score({}) <= 1.0
    assert gate.score({**values, "not_a_feature": 3.0}) == gate.score(values)


def test_the_length_and_strategy_heads(trained) -> None:
    gate, _, rows = trained
    assert gate.length_head is not None and gate.length_head.classes == list(LENGTH_OPTIONS)
    block = dict(rows[0]["block"]["features"], lines=3.0)
    assert gate.length(dict(block, line2_lp_mean=-1.0)) in ("lines2", "lines3", "block")
    assert gate.length(dict(block, line2_lp_mean=-5.0)) == "line"
    assert gate.strategy_head is not None and gate.strategy(rows[0]["single"]["features"]) in STRATEGIES


def test_a_gate_is_saved_as_lightgbm_text_and_json_and_loads_back(trained, tmp_path: Path) -> None:
    gate, _, rows = trained
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1" * 100)
    gate.meta["model_fingerprint"] = model_fingerprint(model)
    gate.checks = [(rows[0]["single"]["features"], True), (rows[1]["single"]["features"], False)]
    gate.save(model / "gate")
    files = sorted(p.name for p in (model / "gate").iterdir())
    seeds = [f"quality.{k}.txt" for k in range(1, SEEDS)]
    assert files == ["checks.jsonl.gz", "gate.json", "length.txt", *seeds, "quality.txt", "strategy.txt"]
    assert len(gate.quality.boosters) == SEEDS
    assert (model / "gate" / "quality.txt").read_text().startswith("tree\n")
    meta = json.loads((model / "gate" / "gate.json").read_text())
    assert meta["threshold"] == gate.threshold and meta["heads"]["quality"]["features"] == gate.quality.features
    loaded = load_gate(model)
    assert loaded is not None and not loaded.stale
    for row in rows[:50]:
        values = row["single"]["features"]
        assert loaded.score(values) == pytest.approx(gate.score(values), abs=1e-12)
        assert loaded.strategy(values) == gate.strategy(values)
        assert loaded.length(row["block"]["features"]) == gate.length(row["block"]["features"])
    assert len(loaded.checks) == 2 and loaded.checks[0][1] is True
    assert loaded.checks[0][0]["lp_mean"] == pytest.approx(rows[0]["single"]["features"]["lp_mean"], abs=1e-4)
    (model / "model.safetensors").write_bytes(b"weights v2" * 100)  # the model changed under the gate
    assert Gate.load(model / "gate", model).stale


def test_the_quality_head_averages_its_seeds_boosters(trained, tmp_path: Path) -> None:
    gate, _, rows = trained
    head = gate.quality
    assert len(head.boosters) == SEEDS > 1
    values = [row["single"]["features"] for row in rows[:40]]
    alone = [float(Head([b], head.features).predict(values[0])) for b in head.boosters]
    assert len({round(a, 9) for a in alone}) > 1  # the seeds differ
    for v in values:
        each = [float(Head([b], head.features).predict(v)) for b in head.boosters]
        assert gate.score(v) == pytest.approx(sum(each) / len(each), abs=1e-12)
    many = head.predict_many(values)
    assert [float(m) for m in many] == pytest.approx([gate.score(v) for v in values], abs=1e-12)


def test_a_gate_of_one_booster_a_file_loads_and_fewer_boosters_leave_no_stale_files(trained, tmp_path: Path) -> None:
    gate, _, rows = trained
    folder = gate.save(tmp_path / "gate")
    meta = json.loads((folder / "gate.json").read_text())
    del meta["heads"]["quality"]["files"]  # a gate written before the seeds were averaged: "file" only
    (folder / "gate.json").write_text(json.dumps(meta))
    old = Gate.load(folder)
    assert len(old.quality.boosters) == 1
    values = rows[0]["single"]["features"]
    assert old.score(values) == pytest.approx(float(Head([gate.quality.boosters[0]], gate.quality.features).predict(values)),
                                             abs=1e-12)
    old.save(folder)  # saved again with one booster: the other seeds' files go
    assert sorted(p.name for p in folder.glob("quality*.txt")) == ["quality.txt"]
    gate.save(folder)
    (folder / "quality.3.txt").unlink()
    with pytest.raises(GateError, match=r"quality booster .*quality\.3\.txt"):
        Gate.load(folder)


def test_no_gate_is_none_and_a_broken_gate_is_a_clear_error(trained, tmp_path: Path) -> None:
    gate, _, _ = trained
    assert load_gate(tmp_path) is None
    folder = gate.save(tmp_path / "gate")
    (folder / "quality.txt").write_text("not a booster\n")
    with pytest.raises(GateError, match="quality booster"):
        Gate.load(folder)
    gate.save(folder)
    meta = json.loads((folder / "gate.json").read_text())
    meta["heads"]["quality"]["features"] = meta["heads"]["quality"]["features"][:-1]
    (folder / "gate.json").write_text(json.dumps(meta))
    with pytest.raises(GateError, match="reads"):
        Gate.load(folder)
    (folder / "gate.json").write_text("{")
    with pytest.raises(GateError, match="not JSON"):
        Gate.load(folder)
    gate.save(folder)
    meta = json.loads((folder / "gate.json").read_text())
    (folder / "gate.json").write_text(json.dumps({**meta, "threshold": 3}))
    with pytest.raises(GateError, match="threshold"):
        Gate.load(folder)


def test_too_few_exact_candidates_is_a_clear_error() -> None:
    rows = gate_data.rows(60, seed=2)
    for row in rows:
        row["single"]["exact"] = False
    with pytest.raises(ValueError, match="too few exact"):
        train_gate(rows)


def test_the_memorys_stand_ins_are_rows_of_the_quality_head_beside_the_models() -> None:
    from glm5_lsp.gate.features import FINISH_REASONS
    from glm5_lsp.gate.train import quality_kinds, quality_rows

    rows = gate_data.rows(300, seed=3)
    rng = random.Random(4)
    for row in rows[::3]:  # a stand-in at every third cursor; it is exact where it says "remembered" loudly
        good = rng.random() < 0.5
        values = dict(gate_data.features(rng), remembered=1.0, finish_reason=float(FINISH_REASONS.index("memory")),
                      lp_mean=None, memory_equal=1.0 if good else 0.0)
        row["memory"] = {"text": "lue" if good else "ss", "features": values, "shown": True, "exact": good,
                         "similarity": 1.0 if good else 0.2, "right_word": good}
    feats, _, _, index = quality_rows(rows)
    kinds = quality_kinds(rows)
    singles = sum(bool(r["single"]["shown"]) for r in rows)
    assert len(feats) == len(kinds) == singles + len(rows[::3]) and kinds.count("memory") == len(rows[::3])
    assert all(feats[k].get("remembered") == 1.0 for k, kind in enumerate(kinds) if kind == "memory")
    assert [index[k] for k, kind in enumerate(kinds) if kind == "memory"] == list(range(0, 300, 3))
    gate, report = train_gate(rows)
    assert report.shown == len(feats)
    stand_in = dict(rows[0]["memory"]["features"], memory_equal=1.0)
    assert gate.score(stand_in) > gate.score(dict(stand_in, memory_equal=0.0))  # it learnt from them
