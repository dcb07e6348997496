"""The gate's per-candidate cost, this checkout's against another's, side by side in one process.

    python benchmarks/gate_cost.py --before CHECKOUT --rows ROWS.jsonl [ROWS.jsonl ...] [--repeats 5]

CHECKOUT is another checkout of the repository (``git worktree add /tmp/before <commit>``): its
``glm5_lsp/gate/stats.py`` and ``features.py`` are loaded beside this checkout's and both are timed on
each candidate in turn (the observer over the candidate's number of steps on random logits of the
embedded model's vocabulary size, its statistics, its features from the row's own document and
numbers, the quality head's prediction: before ``Booster.predict``, after ``Head.predict``), so a
loaded machine slows both alike: read the ratios. Rows are ``glm5-lsp gate collect``'s single-line
candidates with decoding statistics, each cursor once. Not a test.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

PARTS = {
    "steps": "inside the generation: the observer, per decoding step",
    "finish": "step statistics (observer.finish)",
    "features": "features (request_info + features)",
    "score": "prediction (Gate.score)",
    "total": "**statistics, features and prediction**",
}


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[round(q * (len(ordered) - 1))]


def time_one(side: dict[str, Any], head: Any, case: tuple, strings: list[str], ends: list[int],
             mask: Any) -> dict[str, float]:
    import numpy as np

    document, offset, result, raw, logits = case
    stats_module, features_module = side["stats"], side["features"]
    observer = (stats_module.StepObserver(strings, ends) if side["old"]
                else stats_module.StepObserver(strings, ends, None, mask))
    started = time.perf_counter()
    for i, step in enumerate(logits):
        observer(list(range(i)), step)
    t0 = time.perf_counter()
    observer.finish()
    t1 = time.perf_counter()
    real = side["capped"](stats_module.DecodeStats(**raw["stats"]))
    info = features_module.request_info(document, offset, language="python", multiline=False, trigger="automatic")
    values = features_module.features(result, info, real)
    t2 = time.perf_counter()
    if side["old"]:
        head.booster.predict(np.asarray([features_module.vector(values, head.features)], dtype=np.float64),
                             num_threads=1)
    else:
        head.predict(values)
    t3 = time.perf_counter()
    return {"steps": (t0 - started) * 1000 / len(logits), "finish": (t1 - t0) * 1000,
            "features": (t2 - t1) * 1000, "score": (t3 - t2) * 1000, "total": (t3 - t0) * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (its glm5_lsp/gate)")
    parser.add_argument("--rows", type=Path, nargs="+", required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from glm5_lsp.gate.booster import Gate, default_gate_dir
    from glm5_lsp.gate.collect import capped, case_document, read_rows
    from glm5_lsp.memory.heldout import copy_package
    from glm5_lsp.model import default_model_path, load_tokenizer

    torch.set_num_threads(1)
    new_stats = importlib.import_module("glm5_lsp.gate.stats")
    new_features = importlib.import_module("glm5_lsp.gate.features")
    sides = {
        "before": {"old": True, "stats": load("before_stats", args.before / "glm5_lsp" / "gate" / "stats.py"),
                   "features": load("before_features", args.before / "glm5_lsp" / "gate" / "features.py")},
        "after": {"old": False, "stats": new_stats, "features": new_features},
    }
    for side in sides.values():
        side["capped"] = capped
    rows, seen = [], set()
    for row in read_rows(args.rows):
        key = (row["package"], row["path"], row["offset"])
        if key in seen or not ((row.get("single") or {}).get("raw") or {}).get("stats"):
            continue
        seen.add(key)
        rows.append(row)
    model = default_model_path()
    gate = Gate.load(default_gate_dir(model))
    vocab = len(load_tokenizer(model).token_strings())
    strings = [f"t{i}" for i in range(vocab)]
    strings[0] = ""
    ends = new_stats.end_token_ids(strings)
    mask = new_stats.end_mask(ends, vocab)
    timings: dict[str, dict[str, list[float]]] = {name: {part: [] for part in PARTS} for name in sides}
    medians: dict[str, list[float]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="gate-cost-") as tmp:
        roots = {name: copy_package(name, Path(tmp)) for name in sorted({r["package"] for r in rows})}
        for row in rows:
            raw = row["single"]["raw"]
            logits = [torch.randn(vocab) for _ in range(len(raw["stats"]["chars"]) or 1)]
            case = (case_document(roots[row["package"]], row), int(row["offset"]),
                    SimpleNamespace(**raw["result"]), raw, logits)
            totals: dict[str, list[float]] = {name: [] for name in sides}
            for _ in range(args.repeats):
                for name, side in sides.items():  # interleaved: the machine's load falls on both alike
                    parts = time_one(side, gate.quality, case, strings, ends, mask)
                    for part, value in parts.items():
                        timings[name][part].append(value)
                    totals[name].append(parts["total"])
            for name in sides:
                medians[name].append(statistics.median(totals[name]))
    print(f"{len(rows)} candidates, {args.repeats} timings each of each side, interleaved; this machine is "
          f"shared (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print()
    print("| per candidate | before p50 ms | after p50 ms | before p95 ms | after p95 ms | after / before (p50) |")
    print("|---|---|---|---|---|---|")
    columns = {**{PARTS[p]: (timings["before"][p], timings["after"][p]) for p in PARTS},
               f"the same, each candidate's median of {args.repeats}": (medians["before"], medians["after"])}
    for label, (before, after) in columns.items():
        b50, a50 = quantile(before, 0.5), quantile(after, 0.5)
        print(f"| {label} | {b50:.3f} | {a50:.3f} | {quantile(before, 0.95):.3f} | {quantile(after, 0.95):.3f} "
              f"| {a50 / b50:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
