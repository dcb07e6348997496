"""Training the gate's three heads on collected rows, choosing the threshold, updating from local data.

- **quality** (binary): is the shown candidate's first line exactly the real rest of the line
  (``labels``)? Trained on the cursors where something was shown. The rounds and the threshold are
  chosen on out-of-fold predictions with whole packages held out (:func:`grouped_folds`): the
  threshold is the lowest whose precision there is at least :data:`TARGET_PRECISION` (the most exact
  answers shown at that precision). Then one booster is fit on all the rows.
- **length** (multiclass over :data:`~glm5_lsp.gate.booster.LENGTH_OPTIONS`): which prefix of a
  multi-line candidate is most like what was removed, each row weighted by how much the choice matters
  there (the best option's similarity less the worst's: rows where every option is the same weigh 0).
- **strategy** (multiclass over :data:`~glm5_lsp.gate.booster.STRATEGIES`), on cursors whose first
  candidate the quality head does not show (out of fold): ``regenerate`` when the candidate generated
  again without the unsure stop is exact, else ``finish_word`` when the finished word is right, else
  ``silent``.

:func:`update_quality` continues the quality booster on local acceptance outcomes (LightGBM's
``init_model``) and keeps the result only when it is no worse on the held-out checks.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from glm5_lsp.gate.booster import LENGTH_OPTIONS, STRATEGIES, Gate, Head
from glm5_lsp.gate.drift import fit_histograms
from glm5_lsp.gate.features import CATEGORICAL, FEATURES, NAN, vector

log = logging.getLogger(__name__)

PARAMS: dict[str, Any] = {
    "objective": "binary", "learning_rate": 0.05, "num_leaves": 7, "min_data_in_leaf": 15, "max_depth": 4,
    "feature_fraction": 0.7, "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": 1.0,
    "min_gain_to_split": 0.0, "verbose": -1, "num_threads": 1, "seed": 0, "deterministic": True,
    "force_col_wise": True, "max_cat_to_onehot": 8, "min_data_per_group": 10, "cat_smooth": 5.0,
}
MAX_ROUNDS = 400
LENGTH_ROUNDS = 40  # out of fold on BENCHMARK_FIT, 20 to 120 rounds choose alike
STRATEGY_ROUNDS = 60
EARLY_STOP = 40
FOLDS = 5
# Quality boosters averaged, one per LightGBM seed. On the 1,035 FIT rows of the 153.1M-token
# promotion one seed's out-of-fold threshold spread 0.171-0.208 (sd 0.011) over 15 seeds, exact kept
# 72-79% (sd 2.0 points); five averaged: sd 0.003 and 0.7 points, the same 75% kept on average.
SEEDS = 5
MIN_UPDATE_OUTCOMES = 200  # local outcomes (both kinds) before an update is tried
MIN_UPDATE_POSITIVES = 20
UPDATE_ROUNDS = 50
STABILITY_DROP = 0.02  # an update may cost this much ROC AUC on the training check rows, no more
LOCAL_HELD_OUT = "local held out"
# The default threshold shows the most exact answers whose out-of-fold precision (exact / shown) is at
# least this: the floor users were promised is 50% (issue 22), with a margin for held-out packages. On
# BENCHMARK_FIT rows (43.2M-token weights, 388 cursors, candidates scored out of fold by package) 55%
# showed 18.8% of cursors exact where 65% showed 16.2% (BENCHMARKS.md, "The gate's threshold").
TARGET_PRECISION = 0.55


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """The probability that a random positive scores above a random negative (ties count half)."""
    pairs = sorted(zip(scores, labels), key=lambda p: p[0])
    positives = sum(1 for _, y in pairs if y)
    negatives = len(pairs) - positives
    if not positives or not negatives:
        return NAN
    rank_sum, i = 0.0, 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        average_rank = (i + j + 1) / 2  # 1-based ranks i+1..j
        rank_sum += average_rank * sum(1 for k in range(i, j) if pairs[k][1])
        i = j
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def log_loss(scores: Sequence[float], labels: Sequence[bool]) -> float:
    total = 0.0
    for p, y in zip(scores, labels):
        p = min(max(p, 1e-7), 1 - 1e-7)
        total -= math.log(p if y else 1 - p)
    return total / max(len(scores), 1)


def grouped_folds(groups: Sequence[str], folds: int = FOLDS, seed: int = 0) -> list[list[int]]:
    """Row indices in ``folds`` folds, each group (package) whole in one fold."""
    names = sorted(set(groups))
    random.Random(seed).shuffle(names)
    fold_of = {name: k % folds for k, name in enumerate(names)}
    out: list[list[int]] = [[] for _ in range(min(folds, len(names)))]
    for i, group in enumerate(groups):
        out[fold_of[group] % len(out)].append(i)
    return [f for f in out if f]


def _matrix(rows: Sequence[Mapping[str, float | None]], names: Sequence[str]) -> Any:
    import numpy as np

    return np.asarray([vector({k: NAN if v is None else v for k, v in row.items()}, names) for row in rows],
                      dtype=np.float64)


def _dataset(rows: Sequence[Mapping[str, float | None]], labels: Sequence[float], names: Sequence[str],
             weights: Sequence[float] | None = None, reference: Any = None) -> Any:
    import lightgbm as lgb

    return lgb.Dataset(_matrix(rows, names), label=list(labels), weight=None if weights is None else list(weights),
                       feature_name=list(names), categorical_feature=[c for c in CATEGORICAL if c in names],
                       free_raw_data=False, reference=reference, params={"verbose": -1})


def used_features(rows: Sequence[Mapping[str, float | None]], names: Sequence[str] = FEATURES) -> list[str]:
    """The names that are known (not missing) in at least one row and not constant."""
    out = []
    for name in names:
        seen = {row.get(name) for row in rows} - {None}
        seen = {v for v in seen if not (isinstance(v, float) and math.isnan(v))}
        if len(seen) > 1:
            out.append(name)
    return out


@dataclass
class Fitted:
    head: Head
    rounds: int
    oof: list[float] = field(default_factory=list)  # out-of-fold predictions, in row order (binary heads)


def _seeded(params: Mapping[str, Any], count: int) -> list[dict[str, Any]]:
    """``params`` for each of ``count`` averaged boosters: its seed, then the next ones."""
    return [{**params, "seed": int(params.get("seed", 0)) + k} for k in range(count)]


def fit_binary(rows: Sequence[Mapping[str, float | None]], labels: Sequence[bool], groups: Sequence[str],
               names: Sequence[str], params: Mapping[str, Any] | None = None, seeds: int = SEEDS) -> Fitted:
    """Grouped cross-validation (the rounds, out-of-fold scores), then ``seeds`` boosters on every
    row, one per LightGBM seed (``params``' seed, the next ones), averaged; so are the out-of-fold
    scores the threshold is chosen on."""
    import lightgbm as lgb

    params = {**PARAMS, **(params or {})}
    folds = grouped_folds(groups)
    best_rounds = []
    for held in folds:  # the rounds: early stopping on each held-out fold, the first seed
        held_set = set(held)
        train_idx = [i for i in range(len(rows)) if i not in held_set]
        y_train = [labels[i] for i in train_idx]
        if not any(y_train) or all(y_train):
            continue
        train = _dataset([rows[i] for i in train_idx], [float(y) for y in y_train], names)
        valid = _dataset([rows[i] for i in held], [float(labels[i]) for i in held], names, reference=train)
        booster = lgb.train(params, train, num_boost_round=MAX_ROUNDS, valid_sets=[valid],
                            callbacks=[lgb.early_stopping(EARLY_STOP, verbose=False)])
        best_rounds.append(booster.best_iteration or MAX_ROUNDS)
    rounds = max(10, round(sum(best_rounds) / len(best_rounds))) if best_rounds else 100
    seeded = _seeded(params, max(1, seeds))
    # the out-of-fold scores at the common round count (each fold's own best would flatter them)
    sums = [0.0] * len(rows)
    scored = [0] * len(rows)
    for held in folds:
        held_set = set(held)
        train_idx = [i for i in range(len(rows)) if i not in held_set]
        y_train = [labels[i] for i in train_idx]
        if not any(y_train) or all(y_train):
            continue
        matrix = _matrix([rows[i] for i in held], names)
        for seed_params in seeded:  # a Dataset of its own each (one binds the parameters it was made with)
            data = _dataset([rows[i] for i in train_idx], [float(y) for y in y_train], names)
            booster = lgb.train(seed_params, data, num_boost_round=rounds)
            for i, s in zip(held, booster.predict(matrix, num_threads=1)):
                sums[i] += float(s)
                scored[i] += 1
    oof = [total / n if n else NAN for total, n in zip(sums, scored)]
    boosters = [lgb.train(seed_params, _dataset(rows, [float(y) for y in labels], names), num_boost_round=rounds)
                for seed_params in seeded]
    return Fitted(Head(boosters, list(names)), rounds, oof)


def fit_multiclass(rows: Sequence[Mapping[str, float | None]], labels: Sequence[int], classes: Sequence[str],
                   names: Sequence[str], weights: Sequence[float] | None = None, rounds: int = 120) -> Head:
    import lightgbm as lgb

    params = {**PARAMS, "objective": "multiclass", "num_class": len(classes), "min_data_in_leaf": 10}
    booster = lgb.train(params, _dataset(rows, [float(y) for y in labels], names, weights), num_boost_round=rounds)
    return Head([booster], list(names), list(classes))


def best_threshold(scores: Sequence[float], labels: Sequence[bool],
                   min_precision: float | None = None) -> tuple[float, dict[str, float]]:
    """The threshold with the best F1 of "exact" among the scores (ties: the lower one), and its figures.
    ``min_precision``: instead, the lowest threshold whose precision (exact / shown) is at least that
    (the most exact answers shown at that precision); the F1 one where no threshold reaches it."""
    pairs = sorted(((s, y) for s, y in zip(scores, labels) if not math.isnan(s)), key=lambda p: -p[0])
    positives = sum(1 for _, y in pairs if y)
    best = (-1.0, 1.0, 0, 0)
    lowest: tuple[float, float, int, int] | None = None  # (f1, threshold, tp, shown) at min_precision
    tp = 0
    for k, (score, y) in enumerate(pairs, 1):
        tp += y
        if k < len(pairs) and pairs[k][0] == score:
            continue  # a threshold keeps every row of equal score
        precision, recall = tp / k, tp / max(positives, 1)
        f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
        if f1 > best[0] or (f1 == best[0] and score < best[1]):
            best = (f1, score, tp, k)
        if min_precision is not None and tp and precision >= min_precision:
            lowest = (f1, score, tp, k)
    f1, threshold, tp, shown = lowest if lowest is not None else best
    return threshold, {"f1": f1, "precision": tp / max(shown, 1), "recall": tp / max(positives, 1),
                       "shown": shown / max(len(pairs), 1)}


# ---- the rows collect.py writes ----------------------------------------------------------------------


def _features(part: Mapping[str, Any]) -> dict[str, float | None]:
    return dict(part.get("features") or {})


QUALITY_PARTS = ("single", "memory")  # the candidates the quality head judges: the model's, the memory's


def _shown(rows: Sequence[Mapping[str, Any]], parts: Sequence[str]):
    """``(part, row index, candidate)`` of each shown candidate, part by part: the one order
    :func:`quality_rows` and :func:`quality_kinds` share."""
    for part in parts:
        for i, row in enumerate(rows):
            candidate = row.get(part) or {}
            if candidate.get("shown"):
                yield part, i, candidate


def quality_rows(rows: Sequence[Mapping[str, Any]], parts: Sequence[str] = QUALITY_PARTS,
                 ) -> tuple[list[dict], list[bool], list[str], list[int]]:
    """Features, labels (exact), groups (package) and row indices of the candidates shown: each
    cursor's model candidate, and the memory's continuation where it said something else (a row
    index then appears twice: :func:`quality_kinds` tells which)."""
    feats, labels, groups, index = [], [], [], []
    for _, i, candidate in _shown(rows, parts):
        feats.append(_features(candidate))
        labels.append(bool(candidate.get("exact")))
        groups.append(str(rows[i].get("package", "")))
        index.append(i)
    return feats, labels, groups, index


def quality_kinds(rows: Sequence[Mapping[str, Any]], parts: Sequence[str] = QUALITY_PARTS) -> list[str]:
    """Which candidate each of :func:`quality_rows`' rows is ("single" or "memory"), in its order."""
    return [part for part, _, _ in _shown(rows, parts)]


def length_label(options: Mapping[str, float]) -> tuple[int, float]:
    """The best option (the shortest among equals) and the row's weight (best less worst similarity)."""
    values = [float(options.get(name, 0.0)) for name in LENGTH_OPTIONS]
    best = max(range(len(values)), key=lambda i: (values[i], -i))
    return best, max(values) - min(values)


def length_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[list[dict], list[int], list[float], list[int]]:
    feats, labels, weights, index = [], [], [], []
    for i, row in enumerate(rows):
        block = row.get("block") or {}
        if not (block.get("text") or "").strip() or "options" not in block:
            continue
        label, weight = length_label(block["options"])
        feats.append(_features(block))
        labels.append(label)
        weights.append(weight)
        index.append(i)
    return feats, labels, weights, index


def strategy_label(row: Mapping[str, Any]) -> int:
    if (row.get("regen") or {}).get("exact"):
        return STRATEGIES.index("regenerate")
    if (row.get("finish") or {}).get("right"):
        return STRATEGIES.index("finish_word")
    return STRATEGIES.index("silent")


@dataclass
class TrainReport:
    rows: int
    shown: int
    exact: int
    rounds: int
    threshold: float
    oof_auc: float
    oof_auc_similar: float
    oof_at_threshold: dict[str, float]
    length_rows: int = 0
    strategy_rows: int = 0
    strategy_classes: dict[str, int] = field(default_factory=dict)
    features: int = 0

    def lines(self) -> list[str]:
        at = self.oof_at_threshold
        out = [
            f"rows {self.rows}, shown {self.shown}, exact {self.exact}; {self.features} features in use",
            (f"quality head: {self.rounds} rounds; out-of-fold (packages held out) ROC AUC {self.oof_auc:.3f} "
             f"(similar >= 0.8: {self.oof_auc_similar:.3f})"),
            (f"threshold {self.threshold:.3f} (the lowest at {TARGET_PRECISION:.0%} precision out of fold): "
             f"precision {at['precision']:.1%}, exact kept {at['recall']:.1%}, shown {at['shown']:.1%} of shown "
             "candidates"),
            f"length head: {self.length_rows} multi-line rows" if self.length_rows else "length head: no data",
            (f"strategy head: {self.strategy_rows} rejected cursors, classes "
             + ", ".join(f"{k} {v}" for k, v in self.strategy_classes.items())) if self.strategy_rows
            else "strategy head: not trained (too little data)",
        ]
        return out


def train_gate(rows: Sequence[Mapping[str, Any]], *, model_fingerprint: str | None = None,
               min_strategy_rows: int = 30) -> tuple[Gate, TrainReport]:
    """All three heads from collected rows (``collect.py``'s format)."""
    feats, labels, groups, index = quality_rows(rows)
    if sum(labels) < 5 or sum(labels) == len(labels):
        raise ValueError(f"too few exact candidates to train on ({sum(labels)} of {len(labels)} shown)")
    names = used_features(feats)
    fitted = fit_binary(feats, labels, groups, names)
    kinds = quality_kinds(rows)
    similar = [bool((rows[i].get(kind) or {}).get("similarity", 0) >= 0.8) for i, kind in zip(index, kinds)]
    threshold, at = best_threshold(fitted.oof, labels, TARGET_PRECISION)
    report = TrainReport(rows=len(rows), shown=len(feats), exact=sum(labels), rounds=fitted.rounds,
                         threshold=threshold, oof_auc=roc_auc(fitted.oof, labels),
                         oof_auc_similar=roc_auc(fitted.oof, similar), oof_at_threshold=at, features=len(names))
    length_head = None
    l_feats, l_labels, l_weights, _ = length_rows(rows)
    useful = [w > 0 for w in l_weights]
    if sum(useful) >= 30 and len({c for c, u in zip(l_labels, useful) if u}) > 1:
        l_names = used_features(l_feats)
        length_head = fit_multiclass(l_feats, l_labels, LENGTH_OPTIONS, l_names, l_weights, rounds=LENGTH_ROUNDS)
        report.length_rows = sum(useful)
    # the strategy head: cursors whose first candidate the gate would not show (out of fold), or none shown
    oof_of = {i: score for i, score, kind in zip(index, fitted.oof, kinds) if kind == "single"}
    s_feats, s_labels = [], []
    for i, row in enumerate(rows):
        if "regen" not in row or "finish" not in row:
            continue
        score = oof_of.get(i)
        if score is not None and score >= threshold:
            continue
        s_feats.append(_features(row.get("single") or {}))
        s_labels.append(strategy_label(row))
    strategy_head = None
    counts = {name: s_labels.count(k) for k, name in enumerate(STRATEGIES)}
    if len(s_labels) >= min_strategy_rows and sum(1 for v in counts.values() if v >= 5) >= 2:
        s_names = used_features(s_feats)
        strategy_head = fit_multiclass(s_feats, s_labels, STRATEGIES, s_names, rounds=STRATEGY_ROUNDS)
        report.strategy_rows = len(s_labels)
        report.strategy_classes = counts
    meta = {
        "model_fingerprint": model_fingerprint,
        "histograms": {k: h.to_json() for k, h in fit_histograms(feats, names, CATEGORICAL).items()},
        "training": {"rows": len(rows), "shown": len(feats), "exact": sum(labels), "rounds": fitted.rounds,
                     "oof_auc": round(report.oof_auc, 4), "oof_at_threshold": {k: round(v, 4) for k, v in at.items()},
                     "packages": sorted(set(groups))},
    }
    gate = Gate(fitted.head, threshold, length_head, strategy_head, meta)
    return gate, report


# ---- online update --------------------------------------------------------------------------------


@dataclass
class UpdateResult:
    kept_new: bool
    reason: str
    old_auc: dict[str, float] = field(default_factory=dict)  # check set -> AUC
    new_auc: dict[str, float] = field(default_factory=dict)
    gate: Gate | None = None  # the gate to use from now on (the old one when the new is worse)


def update_quality(gate: Gate, local: Sequence[tuple[Mapping[str, float | None], bool]],
                   checks: Mapping[str, Sequence[tuple[Mapping[str, float | None], bool]]] | None = None, *,
                   rounds: int = UPDATE_ROUNDS, holdout_share: float = 0.25,
                   stability: float = STABILITY_DROP) -> UpdateResult:
    """Continue the quality booster on ``local`` (features, kept) pairs, oldest first, via
    ``init_model``. The newest ``holdout_share`` of them is held out: the new booster is kept only when
    its ROC AUC there is no lower than the old one's, and (the stability constraint) no more than
    ``stability`` lower on each of ``checks`` (e.g. the training rows kept beside the gate)."""
    import lightgbm as lgb

    positives = sum(1 for _, y in local if y)
    if len(local) < MIN_UPDATE_OUTCOMES or positives < MIN_UPDATE_POSITIVES or positives == len(local):
        return UpdateResult(False, f"too little local data ({len(local)} outcomes, {positives} kept; "
                            f"{MIN_UPDATE_OUTCOMES} and {MIN_UPDATE_POSITIVES} needed)", gate=gate)
    cut = int(len(local) * (1 - holdout_share))
    train, held = list(local[:cut]), list(local[cut:])
    if not any(y for _, y in held) or all(y for _, y in held):
        return UpdateResult(False, "the held-out part of the local data has only one kind of outcome", gate=gate)
    names = gate.quality.features
    params = {**PARAMS, "learning_rate": 0.03}
    boosters = []
    for old, seed_params in zip(gate.quality.boosters, _seeded(params, len(gate.quality.boosters))):
        data = _dataset([f for f, _ in train], [float(y) for _, y in train], names)  # each booster goes on
        booster = lgb.train(seed_params, data, num_boost_round=rounds, init_model=old)
        boosters.append(lgb.Booster(model_str=booster.model_to_string()))
    candidate = Head(boosters, list(names), list(gate.quality.classes))
    sets = {LOCAL_HELD_OUT: held, **{k: list(v) for k, v in (checks or {}).items() if v}}
    result = UpdateResult(True, "")
    for name, pairs in sets.items():
        labels = [y for _, y in pairs]
        rows = [f for f, _ in pairs]
        result.old_auc[name] = roc_auc(list(gate.quality.predict_many(rows)), labels)
        result.new_auc[name] = roc_auc(list(candidate.predict_many(rows)), labels)
    worse = []
    for name in sets:
        old, new = result.old_auc[name], result.new_auc[name]
        allowed = 0.0 if name == LOCAL_HELD_OUT else stability
        if not math.isnan(old) and (math.isnan(new) or new < old - allowed):
            worse.append(name)
    if worse:
        result.kept_new = False
        result.reason = "the updated booster is worse on " + ", ".join(
            f"{k} (AUC {result.new_auc[k]:.3f} < {result.old_auc[k]:.3f})" for k in worse)
        result.gate = gate
        return result
    meta = {**gate.meta, "updates": [*gate.meta.get("updates", []), {
        "outcomes": len(local), "kept": positives, "rounds": rounds,
        "auc_before": {k: round(v, 4) for k, v in result.old_auc.items() if not math.isnan(v)},
        "auc_after": {k: round(v, 4) for k, v in result.new_auc.items() if not math.isnan(v)}}]}
    result.reason = "the updated booster is no worse: " + ", ".join(
        f"{k} AUC {result.old_auc[k]:.3f} -> {result.new_auc[k]:.3f}" for k in sets)
    result.gate = Gate(candidate, gate.threshold, gate.length_head, gate.strategy_head, meta, gate.stale, gate.checks)
    return result
