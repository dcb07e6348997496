"""How much of a trained gate is LightGBM's seed: one seed's quality head against several averaged.

    python benchmarks/gate_seeds.py --rows ROWS.jsonl [ROWS.jsonl ...] [--seeds 15] [--average 5]

ROWS are ``glm5-lsp gate collect``'s (BENCHMARK_FIT packages only: ``scripts/promote.sh`` leaves
them in ``runs/refit``). The quality head is fitted ``--seeds`` times with one booster (LightGBM
seeds 0, 1, ...: its bagging and feature sampling), then with ``--average`` consecutive seeds'
boosters averaged (what ``glm5_lsp.gate.train.fit_binary`` ships: the rounds from the first seed's
early stopping), on the same rows and the same
grouped folds (packages held out). Each line is the out-of-fold ROC AUC, the threshold chosen at the
shipped precision target and the share of exact candidates it keeps; the last lines give their
spread. The threshold is what ``completion.minQuality`` becomes at a promotion, so its spread is how
far a retrain alone can move what the editor shows. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, nargs="+", required=True)
    parser.add_argument("--seeds", type=int, default=15)
    parser.add_argument("--average", type=int, default=5)
    args = parser.parse_args()

    from glm5_lsp.gate import train

    rows = [json.loads(line) for path in args.rows for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    feats, labels, groups, _ = train.quality_rows(rows)
    names = train.used_features(feats)
    print(f"{len(rows)} rows, {len(feats)} shown candidates, {sum(labels)} exact, {len(set(groups))} packages; "
          f"threshold at {train.TARGET_PRECISION:.0%} out-of-fold precision")
    print("| head | out-of-fold AUC | threshold | exact kept | shown |")
    print("|---|---|---|---|---|")

    def line(label: str, oof: list[float]) -> tuple[float, float]:
        threshold, at = train.best_threshold(oof, labels, train.TARGET_PRECISION)
        print(f"| {label} | {train.roc_auc(oof, labels):.3f} | {threshold:.3f} | {at['recall']:.1%} | {at['shown']:.1%} |",
              flush=True)
        return threshold, at["recall"]

    single: list[list[float]] = []
    figures = []
    for seed in range(args.seeds):
        single.append(train.fit_binary(feats, labels, groups, names, params={"seed": seed}, seeds=1).oof)
        figures.append(line(f"seed {seed}", single[-1]))
    averaged = []
    for start in range(0, args.seeds - args.average + 1, args.average):
        oof = train.fit_binary(feats, labels, groups, names, params={"seed": start}, seeds=args.average).oof
        averaged.append(line(f"seeds {start}-{start + args.average - 1} averaged", oof))
    for label, found in (("one seed", figures), (f"{args.average} averaged", averaged)):
        if len(found) > 1:
            thresholds, kept = [t for t, _ in found], [k for _, k in found]
            print(f"{label}: threshold {min(thresholds):.3f}-{max(thresholds):.3f} (sd {statistics.pstdev(thresholds):.4f}), "
                  f"exact kept {min(kept):.1%}-{max(kept):.1%} (sd {statistics.pstdev(kept):.2%}, mean {statistics.fmean(kept):.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
