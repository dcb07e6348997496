"""The gate on held-out code: which candidates it shows, how long, what it does after a rejected one,
and what it costs; side by side with the pipeline as it ships (no gate).

Rows come from ``glm5-lsp gate collect`` (``glm5_lsp.gate.collect``: the server's own pipeline on the
embedded model with the context engine, called in this process, one request at a time) on the
``BENCHMARK_REPORT`` packages, which neither the model nor the gate trained on (the benchmark refuses
any other package, and any the gate was trained on). ``--collect`` collects them first (appended to
``--rows``; packages already there are skipped). Features are computed again from the rows' raw
numbers and the rebuilt documents (so the figures follow the current feature code) and timed.

Figures:

- **quality**: ROC AUC of the gate's score for "the first line is exactly the rest of the line" (and
  for edit similarity >= 0.8) over the shown candidates; shown share (of all cursors), precision
  (exact / shown) and exact candidates kept, without and with the gate at its default threshold
  (``completion.minQuality``, chosen on ``BENCHMARK_FIT``);
- **length**: at the same cursors with the rest of the block removed too, completed multi-line: mean
  edit similarity of the text kept against what was removed, for the fixed single-line policy (the
  first line), the fixed multi-line policy (all of it), the length head, and the best choice;
- **strategy**: at cursors whose first candidate is not shown: exact and right-word shares of staying
  silent, finishing the word, regenerating (the whole greedy line), the strategy head's choice, and
  what ships: the workspace's settled line (``pipeline.gating.workspace_line``'s rule; the rows hold
  no checks, so a line that would add a blocking diagnostic counts here as shown), else the head;
  then that rule at other counts and shares;
- **cost**: per candidate, the features (``request_info`` + ``features``) and the prediction
  (``Gate.score``), p50 / p95 in ms; the decoding observer's own time per candidate (its steps replayed
  on logits of the model's vocabulary size).

    python benchmarks/gate.py --rows /tmp/gate-report.jsonl --collect --positions 60
    python benchmarks/gate.py --rows /tmp/gate-report.jsonl --gate glm5_lsp/weights/glm5-code-tiny/gate

``--fit`` reads rows of the ``BENCHMARK_FIT`` packages instead, scores each candidate out of fold (a
quality head fitted on the other packages' rows) and prints the strategy section alone: that is
where the rule's count and share were chosen, never on the figures above.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from glm5_lsp.gate.booster import LENGTH_OPTIONS, STRATEGIES, Gate, default_gate_dir
from glm5_lsp.gate.collect import capped, case_document, collect, read_rows, recompute
from glm5_lsp.gate.features import NAN, features, request_info
from glm5_lsp.gate.stats import DecodeStats, StepObserver, end_token_ids
from glm5_lsp.gate.train import (
    TARGET_PRECISION,
    best_threshold,
    fit_binary,
    quality_kinds,
    quality_rows,
    roc_auc,
    used_features,
)
from glm5_lsp.pipeline.gating import LINE_MIN_COUNT, LINE_MIN_SHARE, settled
from glm5_lsp.postprocess import trailing_identifier
from glm5_lsp.train.corpus import BENCHMARK_FIT, BENCHMARK_REPORT


def pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else NAN


def _values(part: dict[str, Any]) -> dict[str, float]:
    return {k: (NAN if v is None else float(v)) for k, v in (part.get("features") or {}).items()}


def quality(rows: list[dict], gate: Gate) -> dict[str, float]:
    rows = [r for r in rows if "single" in r]
    cursors = len(rows)
    shown = [r for r in rows if r["single"]["shown"]]
    scores = [gate.score(_values(r["single"])) for r in shown]
    exact = [bool(r["single"]["exact"]) for r in shown]
    similar = [r["single"]["similarity"] >= 0.8 for r in shown]
    kept = [s >= gate.threshold for s in scores]
    gated_shown = sum(kept)
    gated_exact = sum(1 for k, e in zip(kept, exact) if k and e)
    print(f"cursors {cursors}; shown without the gate {len(shown)}, of them exact {sum(exact)}, "
          f"similar >= 0.8 {sum(similar)}")
    print()
    print("| | shown (of cursors) | precision (exact / shown) | exact candidates kept |")
    print("|---|---|---|---|")
    print(f"| no gate (as shipped) | {pct(len(shown), cursors)} | {pct(sum(exact), len(shown))} | "
          f"{sum(exact)} (100%) |")
    print(f"| gate at completion.minQuality = {gate.threshold:.3f} | {pct(gated_shown, cursors)} | "
          f"{pct(gated_exact, gated_shown)} | {gated_exact} ({pct(gated_exact, sum(exact))}) |")
    auc = roc_auc(scores, exact)
    auc_similar = roc_auc(scores, similar)
    print()
    print(f"ROC AUC (exact) {auc:.3f}; ROC AUC (edit similarity >= 0.8) {auc_similar:.3f}")
    precision_gated = gated_exact / gated_shown if gated_shown else 0.0
    precision_plain = sum(exact) / len(shown) if shown else 0.0
    goals = [("AUC >= 0.85", auc >= 0.85), ("precision >= 50%", precision_gated >= 0.5),
             ("precision >= 2x ungated", precision_gated >= 2 * precision_plain and precision_gated > 0),
             (">= 70% of exact kept", sum(exact) > 0 and gated_exact / sum(exact) >= 0.7)]
    print("goals: " + "; ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in goals))
    return {"auc": auc, "precision": precision_gated}


def length(rows: list[dict], gate: Gate) -> None:
    kinds = {"cursor": "the cursor where it was, the rest of its line and block removed",
             "line_start": "the cursor's line emptied, it and the rest of its block removed"}
    for at, description in kinds.items():
        block = [r for r in rows if "block" in r and r["block"].get("at", "cursor") == at]
        if block:
            seconds = [r["block"]["seconds"] for r in block]
            print(f"#### {description} (request p50 {statistics.median(seconds) * 1000:.0f} ms)")
            print()
            length_table(block, gate)
            print()


def length_table(block: list[dict], gate: Gate) -> None:
    sums = dict.fromkeys(("single", "multi", "head", "best"), 0.0)
    picks = dict.fromkeys(LENGTH_OPTIONS, 0)
    multi_line = 0
    for row in block:
        options = row["block"]["options"]
        sums["single"] += options["line"]
        sums["multi"] += options["block"]
        sums["best"] += max(options.values())
        text = row["block"].get("text") or ""
        if gate.length_head is not None and "\n" in text.strip("\n"):
            choice = gate.length(_values(row["block"])) or "line"
            multi_line += 1
            picks[choice] += 1
        else:
            choice = "line"
        sums["head"] += options[choice]
    n = len(block)
    print(f"{n} cursors with their block removed, {multi_line} multi-line candidates; the head picked "
          + ", ".join(f"{k} {v}" for k, v in picks.items()))
    print()
    print("| policy | mean edit similarity of the text kept |")
    print("|---|---|")
    for name, label in (("single", "fixed single-line (first line)"), ("multi", "fixed multi-line (all of it)"),
                        ("head", "length head" if gate.length_head is not None else "length head (none trained)"),
                        ("best", "best choice per cursor (oracle)")):
        print(f"| {label} | {sums[name] / n:.3f} |")


def _line(row: dict, min_count: int, min_share: float) -> str | None:
    """The workspace's lines' rest of the line at the row's cursor where the rule holds, else None."""
    recalled = (row["single"].get("raw") or {}).get("result", {}).get("recalled") or {}
    line, count, total = recalled.get("line") or "", recalled.get("line_count") or 0, recalled.get("line_total") or 0
    if not line.strip() or not settled(count, total, min_count, min_share):
        return None
    healed = int(row["single"]["features"].get("healed_chars") or 0)
    text = line.split("\n", 1)[0].rstrip()[healed:]
    return text if text.strip() else None


def _memory_word(row: dict) -> str | None:
    """The typed word as the memory's continuation finishes it (insertion text at the healed word's
    start), where that goes on from what was typed; None otherwise."""
    recalled = (row["single"].get("raw") or {}).get("result", {}).get("recalled") or {}
    healed = int(row["single"]["features"].get("healed_chars") or 0)
    typed = trailing_identifier(row["typed_line"])
    word = typed[: len(typed) - healed] + re.match(r"\w*", recalled.get("continuation") or "", re.ASCII).group(0)
    return word if word.startswith(typed) and len(word) > len(typed) else None


def strategy(rows: list[dict], gate: Gate, score: Any = None, threshold: float | None = None) -> None:
    """``score(row, part)``: the gate's score of the row's candidate (``part`` "single", the model's)
    or of the memory's continuation standing in for it ("memory"); default: ``gate`` itself."""
    score = score or (lambda r, part="single": gate.score(_values(r[part])))
    threshold = gate.threshold if threshold is None else threshold
    rejected = [r for r in rows if "single" in r and "regen" in r and "finish" in r and
                (not r["single"]["shown"] or score(r) < threshold)]
    if not rejected:
        print("no rejected cursors")
        return
    n = len(rejected)

    def outcome(row: dict, action: str) -> tuple[bool, bool, bool]:
        """(shown, exact, right word)"""
        if action == "regenerate":
            regen = row["regen"]
            return bool(regen["text"].strip()), bool(regen["exact"]), bool(regen["right_word"])
        if action == "finish_word":
            word = row["finish"]["word"]
            right = bool(row["finish"]["right"])
            typed = trailing_identifier(row["typed_line"])
            return bool(word), right and row["rest"] == word[len(typed):], right
        if action == "memory_word":  # the memory's first word finishes the typed one, else the finisher's
            word = _memory_word(row)
            if word is None:
                return outcome(row, "finish_word")
            typed = trailing_identifier(row["typed_line"])
            return True, row["rest"] == word[len(typed):], word == row["word"]
        if action == "memory":
            stand = row.get("memory") or {}
            return bool(stand.get("shown")), bool(stand.get("exact")), bool(stand.get("right_word"))
        if action.startswith("line "):
            _, count, share = action.split()
            text = _line(row, int(count), float(share))
            if text is None:
                return False, False, False
            typed = trailing_identifier(row["typed_line"])
            word = typed + re.match(r"\w*", text, re.ASCII).group(0)
            return True, text == row["rest"].rstrip(), word == row["word"]
        return False, False, False

    head = (lambda r: gate.strategy(_values(r["single"])) or "silent") if gate.strategy_head is not None else None
    shipped = f"line {LINE_MIN_COUNT} {LINE_MIN_SHARE}"
    policies = {"silent": lambda r: "silent", "finish the word": lambda r: "finish_word",
                "finish the word as the memory does (else the finisher)": lambda r: "memory_word",
                "regenerate": lambda r: "regenerate"}

    def remembered(row: dict) -> bool:  # the memory's continuation, where the gate would show it
        return "memory" in row and row["memory"]["shown"] and score(row, "memory") >= threshold

    if head is not None:
        policies["strategy head"] = head
        policies[f"the workspace's line (>= {LINE_MIN_COUNT} lines, >= {LINE_MIN_SHARE:.0%}), else the head"] = (
            lambda r: shipped if _line(r, LINE_MIN_COUNT, LINE_MIN_SHARE) is not None else head(r))
        policies["the workspace's line, else the memory's continuation the gate shows, else the head "
                 "(what ships)"] = (lambda r: shipped if _line(r, LINE_MIN_COUNT, LINE_MIN_SHARE) is not None
                                    else "memory" if remembered(r) else head(r))
    print(f"{n} cursors whose first candidate is not shown (gate below threshold, or nothing passed)")
    print()
    print("| after a rejected candidate | shown | exact | right word |")
    print("|---|---|---|---|")
    for name, choose in policies.items():
        shown = exact = right = 0
        for row in rejected:
            s, e, w = outcome(row, choose(row))
            shown += s
            exact += e
            right += w
        print(f"| {name} | {pct(shown, n)} | {pct(exact, n)} | {pct(right, n)} |")
    if gate.strategy_head is not None:
        choices = [gate.strategy(_values(r["single"])) for r in rejected]
        print("head's choices: " + ", ".join(f"{s} {choices.count(s)}" for s in STRATEGIES))
    seconds = [r["regen"]["seconds"] for r in rejected if r["regen"].get("seconds") is not None]
    if seconds:
        print(f"regenerating costs a request: p50 {statistics.median(seconds) * 1000:.0f} ms")
    print()
    print("The workspace's line alone at these cursors, by how many lines and what share of them go on that way:")
    print()
    print("| at least lines | at least share | shown | exact | precision (exact / shown) |")
    print("|---|---|---|---|---|")
    for count in (1, 2, 3, 4):
        for share in (0.3, 0.5, 0.7, 0.9):
            got = [outcome(r, f"line {count} {share}") for r in rejected]
            shown, exact = sum(g[0] for g in got), sum(g[1] for g in got)
            mark = " (ships)" if (count, share) == (LINE_MIN_COUNT, LINE_MIN_SHARE) else ""
            print(f"| {count}{mark} | {share:.0%} | {shown} | {exact} | {pct(exact, shown)} |")


def out_of_fold(rows: list[dict]) -> tuple[Any, float]:
    """Each shown candidate's quality score from a head fitted on the other packages' rows, and the
    threshold chosen on those scores as ``glm5-lsp gate train`` chooses it."""
    feats, labels, groups, index = quality_rows(rows)
    fitted = fit_binary(feats, labels, groups, used_features(feats))
    threshold, _ = best_threshold(fitted.oof, labels, TARGET_PRECISION)
    by_row = {(id(rows[i]), kind): s for i, s, kind in zip(index, fitted.oof, quality_kinds(rows))}
    return (lambda r, part="single": by_row.get((id(r), part), NAN)), threshold


def cost(rows: list[dict], roots: dict[str, Path], gate: Gate, vocab: int, repeats: int) -> None:
    """Per candidate, what the gate adds: inside the generation, the observer's copy of each step's
    logits; after it, the statistics (``finish``), the features, the score and the drift count (what
    ``CompletionGate.judge`` does). The steps are replayed on random logits of the model's vocabulary
    size, the features on the row's own document and numbers."""
    import torch

    from glm5_lsp.gate.drift import DriftMonitor

    torch.set_num_threads(1)
    strings = [f"t{i}" for i in range(vocab)]
    strings[0] = ""
    ends = end_token_ids(strings)
    monitor = DriftMonitor.from_meta(gate.meta)
    step_ms: list[float] = []
    parts: dict[str, list[float]] = {"finish": [], "features": [], "score": [], "drift": [], "total": []}
    medians: list[float] = []
    for row in rows:
        raw = (row.get("single") or {}).get("raw")
        if not raw or not raw.get("stats"):
            continue
        document = case_document(roots[row["package"]], row)
        result = SimpleNamespace(**raw["result"])
        real = capped(DecodeStats(**raw["stats"]))
        steps = real.steps
        if not steps:
            continue
        logits = [torch.randn(vocab) for _ in range(steps)]
        totals = []
        for _ in range(repeats):
            observer = StepObserver(strings, ends)
            started = time.perf_counter()
            for i, step in enumerate(logits):
                observer(list(range(i)), step)
            t0 = time.perf_counter()
            observer.finish()
            t1 = time.perf_counter()
            info = request_info(document, int(row["offset"]), language="python", multiline=False, trigger="automatic")
            values = features(result, info, real)  # the row's own numbers (the replay's are random)
            t2 = time.perf_counter()
            gate.score(values)
            t3 = time.perf_counter()
            monitor.add(values)
            t4 = time.perf_counter()
            step_ms.append((t0 - started) * 1000 / steps)
            for name, (a, b) in (("finish", (t0, t1)), ("features", (t1, t2)), ("score", (t2, t3)),
                                 ("drift", (t3, t4)), ("total", (t0, t4))):
                parts[name].append((b - a) * 1000)
            totals.append((t4 - t0) * 1000)
        medians.append(statistics.median(totals))
    print(f"{len(medians)} candidates, {repeats} timings each; this machine is shared (load average "
          f"{_load():.1f} on {_cores()} cores)")
    print()
    print("| per candidate | p50 ms | p95 ms |")
    print("|---|---|---|")
    print(f"| inside the generation: the observer, per decoding step | {quantile(step_ms, 0.5):.3f} | "
          f"{quantile(step_ms, 0.95):.3f} |")
    labels = {"finish": "step statistics (observer.finish)", "features": "features (request_info + features)",
              "score": "prediction (Gate.score)", "drift": "drift count (DriftMonitor.add)",
              "total": "**features and prediction, all of the above**"}
    for name, label in labels.items():
        print(f"| {label} | {quantile(parts[name], 0.5):.3f} | {quantile(parts[name], 0.95):.3f} |")
    print(f"| the same, each candidate's median of {repeats} | {quantile(medians, 0.5):.3f} | "
          f"{quantile(medians, 0.95):.3f} |")
    p95 = quantile(parts["total"], 0.95)
    print(f"goal: features and prediction <= 2 ms p95: {'met' if p95 <= 2.0 else 'NOT met'} "
          f"(p95 {p95:.2f} ms over every timing; {quantile(medians, 0.95):.2f} ms over per-candidate medians)")


def _load() -> float:
    import os

    return os.getloadavg()[0]


def _cores() -> int:
    import os

    return os.cpu_count() or 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, nargs="+", required=True,
                        help="rows from glm5-lsp gate collect on REPORT packages (--collect appends to the first)")
    parser.add_argument("--collect", action="store_true", help="collect the rows first (appended; resumable)")
    parser.add_argument("--packages", nargs="+", default=list(BENCHMARK_REPORT))
    parser.add_argument("--positions", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gate", type=Path, default=None, help="gate folder (default: the embedded model's)")
    parser.add_argument("--repeats", type=int, default=3, help="timings per candidate")
    parser.add_argument("--fit", action="store_true",
                        help="BENCHMARK_FIT rows, scored out of fold: the strategy section alone (for choosing)")
    args = parser.parse_args(argv)
    if args.fit and args.packages == list(BENCHMARK_REPORT):
        args.packages = list(BENCHMARK_FIT)
    return args


def main(args: argparse.Namespace) -> int:
    from glm5_lsp.memory.heldout import copy_package
    from glm5_lsp.model import default_model_path, load_tokenizer

    allowed = BENCHMARK_FIT if args.fit else BENCHMARK_REPORT
    unknown = sorted(set(args.packages) - set(allowed))
    if unknown:
        print(f"not a BENCHMARK_{'FIT' if args.fit else 'REPORT'} package: {', '.join(unknown)}")
        return 2
    model = Path(default_model_path())
    gate = Gate.load(args.gate or default_gate_dir(model), model)
    trained_on = set((gate.meta.get("training") or {}).get("packages") or [])
    if trained_on & set(args.packages) and not args.fit:
        print(f"the gate was trained on {', '.join(sorted(trained_on & set(args.packages)))}: not held out")
        return 2
    if args.collect:
        import torch

        torch.set_num_threads(1)
        collect(args.packages, args.rows[0], positions=args.positions, seed=args.seed)
    every = read_rows(args.rows)
    rows, seen, repeated = [], set(), 0
    for row in every:  # a cursor collected twice (another seed's run) counts once, as first collected
        key = (row["package"], row["path"], row["offset"], "single" in row, (row.get("block") or {}).get("at"))
        if key in seen:
            repeated += 1
            continue
        seen.add(key)
        if row["package"] in set(args.packages):
            rows.append(row)
    if repeated:
        print(f"{repeated} cursors collected twice counted once")
    others = {r["package"] for r in every} - set(args.packages)
    if others:
        print(f"left out of the figures (not asked for, or not REPORT packages): {', '.join(sorted(others))}")
    if not rows:
        print("no rows")
        return 1
    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        roots = {name: copy_package(name, Path(tmp)) for name in sorted({r["package"] for r in rows})}
        recompute(rows, roots)
        if args.fit:
            score, threshold = out_of_fold([r for r in rows if "single" in r])
            print(f"packages (BENCHMARK_FIT, for choosing): {', '.join(sorted(roots))}; scored out of fold; "
                  f"threshold {threshold:.3f}")
            print()
            print("### After a rejected candidate")
            strategy(rows, gate, score, threshold)
            return 0
        print(f"packages: {', '.join(sorted(roots))}; gate {args.gate or default_gate_dir(model)} "
              f"(trained on {len(trained_on)} BENCHMARK_FIT packages{', STALE' if gate.stale else ''}); "
              f"threshold {gate.threshold:.3f}")
        print()
        print("### Quality")
        quality(rows, gate)
        print()
        print("### Length")
        length(rows, gate)
        print()
        print("### After a rejected candidate")
        strategy(rows, gate)
        print()
        print("### Cost")
        vocab = len(load_tokenizer(model).token_strings())
        cost(rows, roots, gate, vocab, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
