"""``glm5-lsp gate``: collect labelled candidates, train the gate, update it from the acceptance log,
check drift.

    glm5-lsp gate collect --packages decorator pluggy --positions 100 --out rows.jsonl
    glm5-lsp gate train --data rows.jsonl                 # into <model>/gate (the embedded model's by default)
    glm5-lsp gate train --log                             # update the gate from the local acceptance log
    glm5-lsp gate drift                                   # the log's features against the training ones
    glm5-lsp gate show                                    # what the gate in use was trained on and measured

Training rows must come from ``BENCHMARK_FIT`` packages (or your own code): ``BENCHMARK_REPORT``
packages are for reported figures only, and ``train`` refuses them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from glm5_lsp.memory.heldout import CURSORS

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("\n\n", 1)[1]
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    collect = sub.add_parser("collect", help="run the pipeline on seeded cursors in installed packages; write rows")
    collect.add_argument("--packages", nargs="+", required=True, help="installed distributions (each its own workspace)")
    collect.add_argument("--positions", type=int, default=100, help="cursors per package")
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--at", choices=CURSORS, default="word",
                         help="cursors two characters into an identifier, or right after a space")
    collect.add_argument("--out", type=Path, required=True, help="JSON-lines file (appended; packages in it are skipped)")
    collect.add_argument("--budget-ms", type=int, default=None, help="as-you-type budget (default: the server's)")
    collect.add_argument("--no-block", action="store_true", help="skip the multi-line (length head) request")
    collect.add_argument("--no-regen", action="store_true", help="skip the regenerated candidate (strategy head)")
    collect.add_argument("--only-block", action="store_true",
                         help="only the multi-line request (the length head's data)")
    collect.add_argument("--block-at", choices=("cursor", "line_start"), default="cursor",
                         help="multi-line request at the cursor (the rest of the line and block removed) or on "
                              "the cursor's line emptied (the whole line and the rest of the block removed)")
    collect.add_argument("--block-budget-ms", type=int, default=None,
                         help="the multi-line request's budget (default: as --budget-ms)")
    collect.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    collect.add_argument("--threads", type=int, default=1, help="torch threads")

    train = sub.add_parser("train", help="train the gate from rows, and/or update it from the acceptance log")
    train.add_argument("--data", type=Path, nargs="*", default=[], help="rows from 'gate collect'")
    train.add_argument("--log", nargs="?", const="", default=None,
                       help="update from this acceptance log (no value: the default one in the user data folder)")
    train.add_argument("--model", default=None, help="the model folder the gate is for (default: the embedded model)")
    train.add_argument("--out", type=Path, default=None, help="gate folder (default: <model>/gate)")
    train.add_argument("--recompute", action="store_true",
                       help="compute the rows' features again with this version's code (their packages must be "
                            "installed: each is copied to rebuild the documents)")

    drift = sub.add_parser("drift", help="KL divergence of the acceptance log's features from the training ones")
    drift.add_argument("--log", default="", help="acceptance log (default: the one in the user data folder)")
    drift.add_argument("--model", default=None)
    drift.add_argument("--gate", type=Path, default=None, help="gate folder (default: <model>/gate)")

    show = sub.add_parser("show", help="what the gate was trained on and measured")
    show.add_argument("--model", default=None)
    show.add_argument("--gate", type=Path, default=None)


def _model_dir(value: str | None) -> Path:
    if value:
        return Path(value)
    from glm5_lsp.model import default_model_path

    return Path(default_model_path())


def run(args: argparse.Namespace) -> int:
    from glm5_lsp.gate.booster import GateError

    try:
        return {"collect": _collect, "train": _train, "drift": _drift, "show": _show}[args.action](args)
    except (GateError, ValueError, OSError) as error:
        print(f"glm5-lsp gate {args.action}: {error}", file=sys.stderr)
        return 1


def _collect(args: argparse.Namespace) -> int:
    from importlib import metadata

    import torch

    from glm5_lsp.gate.collect import collect
    from glm5_lsp.memory.heldout import package_files

    torch.set_num_threads(max(1, args.threads))
    missing = []
    for name in args.packages:
        try:
            if not package_files(name):
                missing.append(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        print(f"not installed (or no Python files): {', '.join(missing)}", file=sys.stderr)
        return 2
    written = collect(args.packages, args.out, positions=args.positions, seed=args.seed, budget_ms=args.budget_ms,
                      block=not args.no_block, regen=not args.no_regen, model_path=args.model,
                      single=not args.only_block, block_at=args.block_at, block_budget_ms=args.block_budget_ms,
                      at=args.at)
    print(f"{written} rows written to {args.out}")
    return 0


def _gate_dir(args: argparse.Namespace, model: Path) -> Path:
    from glm5_lsp.gate.booster import default_gate_dir

    return Path(getattr(args, "out", None) or getattr(args, "gate", None) or default_gate_dir(model))


def _train(args: argparse.Namespace) -> int:
    from glm5_lsp.gate.booster import Gate, model_fingerprint
    from glm5_lsp.gate.collect import read_rows
    from glm5_lsp.gate.train import train_gate
    from glm5_lsp.train.corpus import BENCHMARK_REPORT

    if not args.data and args.log is None:
        print("nothing to train from: give --data ROWS and/or --log", file=sys.stderr)
        return 2
    model = _model_dir(args.model)
    folder = _gate_dir(args, model)
    gate = None
    if args.data:
        rows = read_rows(args.data)
        reported = sorted({str(r.get("package")) for r in rows} & set(BENCHMARK_REPORT))
        if reported:
            print(f"refusing to train on BENCHMARK_REPORT packages ({', '.join(reported)}): they are for "
                  "reported figures only", file=sys.stderr)
            return 2
        if args.recompute:
            _recompute(rows)
        gate, report = train_gate(rows, model_fingerprint=model_fingerprint(model))
        gate.checks = check_rows(rows)
        for line in report.lines():
            print(line)
    if args.log is not None:
        if gate is None:
            gate = Gate.load(folder, model)
        updated = _update_from_log(gate, args.log, model)
        if updated is None and not args.data:
            return 0  # the gate in the folder stays as it is
        gate = updated or gate
    assert gate is not None
    gate.save(folder)
    print(f"gate written to {folder} (threshold {gate.threshold:.3f}: completion.minQuality)")
    return 0


def _recompute(rows: list[dict[str, Any]]) -> None:
    import tempfile

    from glm5_lsp.gate.collect import recompute
    from glm5_lsp.memory.heldout import copy_package

    with tempfile.TemporaryDirectory(prefix="gate-train-") as tmp:
        roots = {name: copy_package(name, Path(tmp)) for name in sorted({str(r["package"]) for r in rows})}
        count = recompute(rows, roots)
    print(f"features computed again for {count} candidates")


def check_rows(rows: list[dict[str, Any]], negatives: int = 500, seed: int = 0) -> list[tuple[dict, bool]]:
    """The training rows kept beside the gate for an update's stability check: every exact one and
    up to ``negatives`` others (ROC AUC does not depend on the share of each)."""
    import random

    from glm5_lsp.gate.train import quality_rows

    feats, labels, _, _ = quality_rows(rows)
    pairs = [({k: (float("nan") if v is None else float(v)) for k, v in f.items()}, y) for f, y in zip(feats, labels)]
    positive = [p for p in pairs if p[1]]
    negative = [p for p in pairs if not p[1]]
    random.Random(seed).shuffle(negative)
    return positive + negative[:negatives]


def _update_from_log(gate: Any, log_arg: str, model: Path) -> Any:
    from glm5_lsp.gate.acceptance import default_log_path, read_outcomes
    from glm5_lsp.gate.booster import GateError, model_fingerprint
    from glm5_lsp.gate.drift import DriftMonitor
    from glm5_lsp.gate.train import update_quality

    path = Path(log_arg) if log_arg else default_log_path()
    try:
        current = model_fingerprint(model)
    except (GateError, OSError):
        current = None
    outcomes = sorted(read_outcomes(path), key=lambda o: o.shown_at) if path.exists() else []
    # suggestions another model made say nothing about this one's (records without a model: kept)
    outcomes = [o for o in outcomes if o.model is None or current is None or o.model == current]
    local = [({k: (float("nan") if v is None else float(v)) for k, v in o.features.items()}, o.kept) for o in outcomes]
    # The stability check holds the update to the training rows while they still describe the
    # candidates; once the model under the gate changed (stale) or its features drifted, they no longer do.
    drift = DriftMonitor.from_meta(gate.meta)
    for values, _ in local:
        drift.add(values)
    moved = drift.report()
    checks = {"training check": gate.checks} if gate.checks else {}
    if checks and (gate.stale or moved.flagged):
        why = "the weights changed" if gate.stale else f"the features drifted ({', '.join(moved.drifted[:3])})"
        print(f"{why}: the training rows are not held to (no stability check)")
        checks = {}
    result = update_quality(gate, local, checks)
    print(f"update from {path}: {len(local)} outcomes, {sum(1 for _, y in local if y)} kept: {result.reason}")
    if not result.kept_new:
        print("kept the current booster")
        return None
    if current is not None and result.gate is not None:  # learnt from this model's suggestions: it is its gate now
        result.gate.meta["model_fingerprint"] = current
        result.gate.stale = False
    return result.gate


def _drift(args: argparse.Namespace) -> int:
    from glm5_lsp.gate.acceptance import default_log_path, read_records
    from glm5_lsp.gate.booster import Gate
    from glm5_lsp.gate.drift import DriftMonitor

    model = _model_dir(args.model)
    gate = Gate.load(_gate_dir(args, model), model)
    monitor = DriftMonitor.from_meta(gate.meta)
    path = Path(args.log) if args.log else default_log_path()
    seen = 0
    for record in read_records(path) if path.exists() else ():
        if record["event"] == "shown" and isinstance(record.get("features"), dict):
            monitor.add(record["features"])
            seen += 1
    report = monitor.report()
    print(f"{seen} shown suggestions in {path}")
    print(report.summary())
    for name in report.drifted[:10]:
        print(f"  {name}: KL {report.divergences[name]:.3f}")
    return 3 if report.flagged else 0


def _show(args: argparse.Namespace) -> int:
    from glm5_lsp.gate.booster import Gate

    model = _model_dir(args.model)
    folder = _gate_dir(args, model)
    gate = Gate.load(folder, model)
    summary = {
        "folder": str(folder), "threshold": gate.threshold, "stale": gate.stale,
        "heads": {name: len(head.features) for name, head in
                  (("quality", gate.quality), ("length", gate.length_head), ("strategy", gate.strategy_head))
                  if head is not None},
        "training": gate.meta.get("training"), "updates": gate.meta.get("updates", []),
    }
    print(json.dumps(summary, indent=1))
    return 0
