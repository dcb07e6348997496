"""``glm5-lsp train``: build the corpus and tokenizer, train to a wall-clock budget, write the model folder;
or continue training a model on the whole corpus in runs that resume, and promote the result.

glm5-lsp train --out runs/cpu --preset cpu --budget-minutes 35
glm5-lsp train --out $OUT/model --preset gpu --budget-minutes 8 --device cuda
glm5-lsp train --continue-from glm5_lsp/weights/glm5-code-tiny --out runs/continued --threads 1
glm5-lsp train --resume runs/continued --threads 1
glm5-lsp train --promote runs/continued            # into the shipped model, when better
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from glm5_lsp.train.corpus import DEFAULT_HOLDOUT, CorpusConfig
from glm5_lsp.train.fim import FimConfig
from glm5_lsp.train.presets import PRESETS, get_preset
from glm5_lsp.train.schedule import STAGES

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the model, tokenizer, manifest, log, card"
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="model size and run knobs")
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="training wall-clock budget (default: 35 on cpu, 8 on gpu, 0.5 for tiny)",
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:N")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--eval-seq-len", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument(
        "--max-train-bytes", type=int, default=None, help="subsample the corpus to this many bytes"
    )
    parser.add_argument("--index-topk", type=int, default=None)
    parser.add_argument(
        "--steps",
        default=None,
        metavar="D,W,S",
        help="explicit steps for dense,indexer_warmup,sparse instead of sizing to the budget",
    )
    parser.add_argument("--fim-rate", type=float, default=0.5)
    parser.add_argument(
        "--holdout",
        action="append",
        default=None,
        help=f"a package to hold out for evaluation (repeatable; default {', '.join(DEFAULT_HOLDOUT)})",
    )
    parser.add_argument(
        "--stdlib", type=Path, default=None, help="standard library folder (default: this Python's)"
    )
    parser.add_argument(
        "--site-dir",
        type=Path,
        action="append",
        default=None,
        help="site-packages folder (repeatable; default: this Python's)",
    )
    parser.add_argument(
        "--benchmarks",
        type=Path,
        default=REPO_ROOT.parent / "shared" / "benchmarks",
        help="benchmarks folder: never read as data; HumanEval prompts from it are filtered out",
    )
    parser.add_argument(
        "--guard-file",
        type=Path,
        default=None,
        help="benchmark guard (HumanEval fingerprints) written by --write-guard, for machines without the benchmarks",
    )
    parser.add_argument(
        "--write-guard",
        type=Path,
        default=None,
        help="only write the benchmark guard file built from --benchmarks, then exit",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes for the corpus filters")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the training step (default: on CUDA only)",
    )
    parser.add_argument("--name", default="glm5-code-tiny")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous run in --out")
    parser.add_argument(
        "--add-eval",
        type=Path,
        action="append",
        default=None,
        metavar="REPORT_JSON",
        help="only re-write --out's model card with these `glm5-lsp eval` reports added (repeatable)",
    )

    group = parser.add_argument_group("continued training (resumable runs from a trained model)")
    group.add_argument("--continue-from", type=Path, default=None, metavar="MODEL",
                       help="start a continued run in --out from this model folder (fresh optimizer, warm-up); "
                            "'shipped' for the embedded model")
    group.add_argument("--resume", type=Path, default=None, metavar="RUN",
                       help="resume the continued run in this folder from its last checkpoint")
    group.add_argument("--promote", type=Path, default=None, metavar="RUN",
                       help="measure the run's checkpoint against --into and replace it when better")
    group.add_argument("--into", type=Path, default=None, metavar="MODEL",
                       help="the model folder --promote measures against and writes (default: the embedded model)")
    group.add_argument("--min-gain", type=float, default=0.0,
                       help="--promote: the relative perplexity gain needed (default 0: any improvement)")
    group.add_argument("--dry-run", action="store_true", help="--promote: measure only")
    group.add_argument("--clone", type=Path, default=None, metavar="RUN",
                       help="a second run of RUN's model in --out, reading the stream in its own order (the "
                            "run's seed plus one), to be averaged with it by --merge (train/merge.py)")
    group.add_argument("--merge", type=Path, nargs="+", default=None, metavar="RUN",
                       help="average the checkpoints of these runs (one cloned from the other, both stopped) "
                            "into each of them")
    group.add_argument("--minutes", type=float, default=None,
                       help="stop the continued run after this many minutes (default: until SIGTERM/SIGINT)")
    group.add_argument("--max-steps", type=int, default=None, help="stop after this many steps in this call")
    group.add_argument("--until-step", type=int, default=None, help="stop once the run has taken this many steps")
    group.add_argument("--checkpoint-minutes", type=float, default=5.0, help="checkpoint interval (default 5)")
    group.add_argument("--checkpoint-steps", type=int, default=None, help="also checkpoint every n steps")
    group.add_argument("--shard-bytes", type=int, default=None, help="text per shuffled shard (default 2 MB)")


_DEFAULT_BUDGET = {"tiny": 0.5, "cpu": 35.0, "gpu": 8.0}


def _steps(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--steps wants three positive integers D,W,S, got {text!r}")
    return dict(zip(STAGES, (int(p) for p in parts)))


def run(args: argparse.Namespace) -> int:
    from glm5_lsp.train.contamination import BenchmarkGuard

    if args.write_guard is not None:
        guard = BenchmarkGuard.from_benchmarks(args.benchmarks)
        guard.save(args.write_guard)
        print(f"wrote {len(guard.digests)} HumanEval fingerprints to {args.write_guard}")
        return 0
    if args.clone is not None or args.merge is not None:
        return run_pair(args)
    if args.continue_from is not None or args.resume is not None or args.promote is not None:
        return run_continued(args)
    if args.out is None:
        print("glm5-lsp train: --out is required", file=sys.stderr)
        return 2
    if args.add_eval:
        from glm5_lsp.train.report import refresh_card

        try:
            card = refresh_card(args.out, args.add_eval)
        except (OSError, ValueError, KeyError) as exc:
            print(f"glm5-lsp train: {exc}", file=sys.stderr)
            return 1
        print(f"updated {card}")
        return 0
    try:
        steps = _steps(args.steps)
        fim = FimConfig(rate=args.fim_rate)
    except ValueError as exc:
        print(f"glm5-lsp train: {exc}", file=sys.stderr)
        return 2
    import torch

    from glm5_lsp.train.pipeline import RunOptions
    from glm5_lsp.train.pipeline import run as run_pipeline

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = get_preset(args.preset).with_overrides(
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        eval_seq_len=args.eval_seq_len,
        batch_size=args.batch_size,
        lr=args.lr,
        max_train_bytes=args.max_train_bytes,
    )
    if args.index_topk is not None:
        preset = preset.with_overrides(model={**preset.model, "index_topk": args.index_topk})
    corpus = CorpusConfig(
        stdlib=args.stdlib,
        site_dirs=tuple(args.site_dir) if args.site_dir else None,
        holdout=tuple(args.holdout) if args.holdout else DEFAULT_HOLDOUT,
        workers=args.workers,
    )
    options = RunOptions(
        out=args.out,
        preset=preset,
        budget_minutes=args.budget_minutes
        if args.budget_minutes is not None
        else _DEFAULT_BUDGET[preset.name],
        device=args.device,
        seed=args.seed,
        compile=args.compile,
        benchmarks=args.benchmarks if args.benchmarks and args.benchmarks.is_dir() else None,
        guard_file=args.guard_file,
        corpus=corpus,
        fim=fim,
        steps=steps,
        name=args.name,
        command="glm5-lsp train " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 2
        else "glm5-lsp train",
        overwrite=args.overwrite,
    )
    try:
        summary = run_pipeline(options)
    except (FileExistsError, FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"glm5-lsp train: {exc}", file=sys.stderr)
        return 1
    ev = summary["eval"]
    print(
        f"wrote {args.out}: {summary['parameters']:,} parameters, {summary['tokens_seen']:,} tokens seen "
        f"in {summary['train_seconds']:.0f} s of training"
    )
    for name, value in ev["table"]:
        print(f"  {name}: {value}")
    return 0


def run_continued(args: argparse.Namespace) -> int:
    """``--continue-from``, ``--resume`` and ``--promote``."""
    import torch

    from glm5_lsp.model.loading import CheckpointError, default_model_path

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.promote is not None:
            from glm5_lsp.train.promote import promote

            target = args.into or default_model_path()
            result = promote(args.promote, target, min_gain=args.min_gain, dry_run=args.dry_run)
            for m in (result.shipped, *result.candidates):
                print(f"  {m.label}: held-out perplexity {m.ppl_64:.3f} (64 rows), {m.ppl_8:.3f} (8 rows)")
            print(result.message)
            return 0 if result.promoted or args.dry_run else 3
        from glm5_lsp.train.continued import RunLimits, train

        run_dir = args.resume
        if args.continue_from is not None:
            if args.out is None:
                print("glm5-lsp train: --continue-from needs --out (the run folder)", file=sys.stderr)
                return 2
            run_dir = args.out
            _start_continued(args)
        limits = RunLimits(minutes=args.minutes, steps=args.max_steps, until_step=args.until_step,
                           checkpoint_minutes=args.checkpoint_minutes, checkpoint_steps=args.checkpoint_steps)
        state = train(run_dir, limits)
    except (CheckpointError, FileExistsError, FileNotFoundError, RuntimeError, ValueError) as exc:
        print(f"glm5-lsp train: {exc}", file=sys.stderr)
        return 1
    print(f"{run_dir}: {state.run_step} steps in this run, {state.tokens_total:,} tokens seen in all, "
          f"last loss {state.last_loss}; checkpoint in {run_dir / 'checkpoint'}")
    return 0


def run_pair(args: argparse.Namespace) -> int:
    """``--clone`` and ``--merge``: two runs of one model on the two cores, averaged now and then."""
    from glm5_lsp.model.loading import CheckpointError
    from glm5_lsp.train.merge import RunBusy, clone_run, merge_runs

    try:
        if args.clone is not None:
            if args.out is None:
                print("glm5-lsp train: --clone needs --out (the second run's folder)", file=sys.stderr)
                return 2
            clone_run(args.clone, args.out)
            print(f"{args.out}: a second run of {args.clone}'s model; start it with "
                  f"GLM5_RUN={args.out} scripts/cpu_train.sh, average the two with --merge {args.clone} {args.out}")
            return 0
        merged = merge_runs(args.merge)
    except (CheckpointError, FileExistsError, FileNotFoundError, RunBusy, ValueError) as exc:
        print(f"glm5-lsp train: {exc}", file=sys.stderr)
        return 1
    print(f"averaged {merged.tensors} tensors of {', '.join(merged.runs)} into each: "
          f"{merged.tokens_total:,} tokens seen in all")
    return 0


def _start_continued(args: argparse.Namespace) -> None:
    import json

    from glm5_lsp.model.loading import default_model_path
    from glm5_lsp.train.contamination import BenchmarkGuard
    from glm5_lsp.train.continued import ContinueConfig, start_run
    from glm5_lsp.train.corpus import build_corpus

    init = default_model_path() if str(args.continue_from) == "shipped" else args.continue_from
    metrics_file = init / "metrics.json"
    metrics = json.loads(metrics_file.read_text(encoding="utf-8")) if metrics_file.is_file() else {}
    where = metrics.get("continued") or {}
    guard = (BenchmarkGuard.load(args.guard_file) if args.guard_file is not None
             else BenchmarkGuard.from_benchmarks(args.benchmarks) if args.benchmarks and args.benchmarks.is_dir()
             else None)
    if guard is None:
        raise RuntimeError("no benchmark guard: pass --benchmarks (a folder with HumanEval) or --guard-file")
    corpus = build_corpus(CorpusConfig(
        stdlib=args.stdlib, site_dirs=tuple(args.site_dir) if args.site_dir else None,
        holdout=tuple(args.holdout) if args.holdout else DEFAULT_HOLDOUT, workers=args.workers,
        guard=guard, benchmarks=args.benchmarks if args.benchmarks and args.benchmarks.is_dir() else None,
        seed=args.seed,
    ))
    values = {"init": str(init.resolve()), "seed": int(where.get("seed", args.seed)),
              "start_tokens": int(metrics.get("tokens_seen") or 0),
              "start_schedule_step": int(where.get("schedule_step", 0))}
    if "position" in where:
        values["start_position"] = where["position"]
        values["shard_bytes"] = int(where.get("shard_bytes", 2_000_000))
    if args.shard_bytes:
        values["shard_bytes"] = args.shard_bytes
    if args.lr:
        values["lr"] = args.lr
    if args.batch_size:
        values["batch_size"] = args.batch_size
    if args.seq_len:
        values["seq_len"] = args.seq_len
    values["fim_rate"] = args.fim_rate
    start_run(args.out, ContinueConfig(**values), corpus)
    log.info("started a continued run in %s: %d training files, %d held out", args.out, len(corpus.train),
             len(corpus.heldout))
