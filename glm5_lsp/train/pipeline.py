"""One training run from installed source to a shippable model folder.

corpus -> tokenizer -> FIM + packing -> model -> measure step times -> size the stages to the budget
-> dense -> indexer warm-up -> sparse -> held-out figures -> samples -> weights, tokenizer,
manifest, log, loss curve, model card. Everything lands in ``options.out``:

    config.json, model*.safetensors (+ index), tokenizer.json, corpus_manifest.json,
    train_log.jsonl, loss_curve.png, metrics.json, MODEL_CARD.md
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glm5_lsp.model import GlmMoeDsaConfig, GlmMoeDsaForCausalLM, load_tokenizer, save_model
from glm5_lsp.train.contamination import BenchmarkGuard
from glm5_lsp.train.corpus import Corpus, CorpusConfig, Document, build_corpus
from glm5_lsp.train.data import Batches, encode_documents, pack
from glm5_lsp.train.fim import FimConfig
from glm5_lsp.train.metrics import indexer_recall, perplexity
from glm5_lsp.train.presets import Preset
from glm5_lsp.train.report import model_card, plot_loss
from glm5_lsp.train.runlog import RunLog, read_log
from glm5_lsp.train.samples import greedy_samples
from glm5_lsp.train.schedule import STAGES, StagePlan, StageShares, plan_stages
from glm5_lsp.train.tokenizer import save_tokenizer, train_tokenizer
from glm5_lsp.train.trainer import OptimConfig, Trainer

log = logging.getLogger(__name__)

OUTPUT_FILES = (
    "config.json",
    "tokenizer.json",
    "corpus_manifest.json",
    "train_log.jsonl",
    "loss_curve.png",
    "metrics.json",
    "MODEL_CARD.md",
)
MAX_SHIPPED_BYTES = 64 * 1024 * 1024


@dataclass
class RunOptions:
    """Everything one run needs; ``cli.py`` builds it from the command line."""

    out: Path
    preset: Preset
    budget_minutes: float
    device: str = "auto"
    seed: int = 0
    compile: bool | None = None  # None: on CUDA only
    benchmarks: Path | None = None  # HumanEval fingerprints come from here (and it is never read as data)
    guard_file: Path | None = None  # or from a guard file written by ``BenchmarkGuard.save``
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    fim: FimConfig = field(default_factory=FimConfig)
    shares: StageShares = field(default_factory=StageShares)
    steps: dict[str, int] | None = None  # explicit steps per stage instead of sizing to the budget
    name: str = "glm5-code-tiny"
    command: str = "glm5-lsp train"
    probe_steps: int = 2
    overwrite: bool = False


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty; pass --overwrite to replace a previous run there")
        for name in OUTPUT_FILES + ("model.safetensors.index.json",):
            (out / name).unlink(missing_ok=True)
        for shard in out.glob("model*.safetensors"):
            shard.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _guard(options: RunOptions) -> BenchmarkGuard | None:
    if options.guard_file is not None:
        return BenchmarkGuard.load(options.guard_file)
    if options.benchmarks is not None and options.benchmarks.is_dir():
        return BenchmarkGuard.from_benchmarks(options.benchmarks)
    return None


def _texts(docs: list[Document]) -> list[str]:
    return [d.read() for d in docs]


def _tokenizer_sample(docs: list[Document], max_bytes: int, seed: int) -> list[str]:
    """A deterministic sample of training files for the tokenizer (by hash of seed and digest)."""
    order = sorted(docs, key=lambda d: hashlib.sha256(f"tok{seed}:{d.digest}".encode()).digest())
    picked, total = [], 0
    for doc in order:
        if total >= max_bytes:
            break
        picked.append(doc)
        total += doc.size
    return _texts(picked)


def model_config(preset: Preset, vocab_size: int, eos_id: int) -> GlmMoeDsaConfig:
    return GlmMoeDsaConfig.from_dict(
        {
            **preset.model,
            "vocab_size": vocab_size,
            "eos_token_id": eos_id,
            "bos_token_id": None,
            "pad_token_id": eos_id,
        }
    )


def active_parameters(config: GlmMoeDsaConfig, total: int) -> int:
    """Parameters touched per token: all but the routed experts a token does not use."""
    moe_layers = sum(t == "sparse" for t in config.mlp_layer_types)
    unused = config.n_routed_experts - config.num_experts_per_tok
    return total - moe_layers * unused * 3 * config.hidden_size * config.moe_intermediate_size


def run(options: RunOptions) -> dict[str, Any]:
    """Run the whole pipeline; returns the summary that ``metrics.json`` also holds."""
    t_start = time.monotonic()
    preset = options.preset
    device = resolve_device(options.device)
    torch.manual_seed(options.seed)
    _prepare_out(options.out, options.overwrite)
    runlog = RunLog(options.out / "train_log.jsonl")
    runlog.write(
        "start",
        preset=preset.to_dict(),
        device=str(device),
        torch=torch.__version__,
        python=platform.python_version(),
        threads=torch.get_num_threads(),
        budget_minutes=options.budget_minutes,
    )

    # -- data -------------------------------------------------------------------------------------
    guard = _guard(options)
    corpus_config = replace(
        options.corpus,
        guard=guard,
        benchmarks=options.benchmarks,
        max_train_bytes=preset.max_train_bytes,
        seed=options.seed,
    )
    corpus: Corpus = build_corpus(corpus_config)
    if not corpus.train:
        raise RuntimeError("the corpus is empty: no permissively licensed Python source passed the filters")
    corpus.write_manifest(options.out / "corpus_manifest.json")
    runlog.write(
        "corpus",
        **corpus.manifest["totals"],
        dropped=corpus.manifest["dropped_files"],
        guard=corpus.manifest["benchmark_guard"],
    )

    hf_tok = train_tokenizer(
        _tokenizer_sample(corpus.train, preset.tokenizer_sample_bytes, options.seed),
        vocab_size=preset.vocab_size,
    )
    save_tokenizer(hf_tok, options.out)
    chunk_chars = preset.seq_len * 3
    train_stream = encode_documents(_texts(corpus.train), hf_tok, options.fim, options.seed, chunk_chars)
    held_stream = encode_documents(
        _texts(corpus.heldout), hf_tok, FimConfig(rate=0.0), options.seed, chunk_chars
    )
    train_rows = pack(train_stream, preset.seq_len)
    batches = Batches(train_rows, preset.batch_size, options.seed)
    runlog.write(
        "data",
        vocab_size=hf_tok.get_vocab_size(),
        train_tokens=len(train_stream),
        heldout_tokens=len(held_stream),
        train_sequences=len(train_rows),
        bytes_per_token=round(corpus.manifest["totals"]["train_bytes"] / max(1, len(train_stream)), 3),
        prep_seconds=round(time.monotonic() - t_start, 1),
    )

    # -- model and budget -------------------------------------------------------------------------
    config = model_config(preset, hf_tok.get_vocab_size(), eos_id=0)
    model = GlmMoeDsaForCausalLM(config)
    model.init_weights(options.seed)
    model.to(device)
    optim = OptimConfig(
        lr=preset.lr,
        indexer_lr=preset.indexer_lr,
        warmup_steps=preset.warmup_steps,
        weight_decay=preset.weight_decay,
        grad_clip=preset.grad_clip,
        balance_rate=preset.balance_rate,
    )
    use_compile = options.compile if options.compile is not None else device.type == "cuda"
    trainer = Trainer(
        model, batches, optim, device, runlog, compile_model=use_compile, micro_batch=preset.micro_batch
    )
    budget_s = options.budget_minutes * 60.0
    t_probe = time.monotonic()
    seconds_per_step = {stage: trainer.measure(stage, steps=options.probe_steps) for stage in STAGES}
    probe_s = time.monotonic() - t_probe
    if options.steps is not None:
        plan = StagePlan(dict(options.steps), seconds_per_step, budget_s)
    else:
        plan = plan_stages(max(budget_s - probe_s, 1.0), seconds_per_step, options.shares)
    runlog.write("plan", **plan.to_dict(), probe_seconds=round(probe_s, 1), compile=use_compile)

    # -- train ------------------------------------------------------------------------------------
    eval_rows_short = pack(held_stream, preset.seq_len)[: max(1, preset.eval_sequences)]
    results = []
    t_train = time.monotonic()
    for i, stage in enumerate(STAGES):
        seconds = None
        if options.steps is None:
            # This stage's share of the time left, so an overrun cannot starve the later stages.
            left = [getattr(options.shares, s) for s in STAGES[i:]]
            share = getattr(options.shares, stage) / max(sum(left), 1e-9)
            seconds = max(1.0, share * (t_train + budget_s - probe_s - time.monotonic()))
        results.append(trainer.run_stage(stage, plan.steps[stage], seconds))
        if stage != "indexer_warmup" and len(eval_rows_short):
            loss = float(np.log(perplexity(model, eval_rows_short, dense=stage == "dense")))
            runlog.write("eval", stage=stage, tokens=trainer.tokens_seen, heldout_loss=round(loss, 4))
    train_seconds = time.monotonic() - t_train
    trainer.balancer.close()

    # -- evaluate, sample, save -------------------------------------------------------------------
    figures = evaluate(model, held_stream, preset)
    runlog.write("eval_final", **{k: v for k, v in figures.items() if k != "table"})
    tokenizer = load_tokenizer(options.out)
    samples = greedy_samples(model, tokenizer)
    save_dtype = getattr(torch, preset.save_dtype)
    model.to("cpu", dtype=save_dtype)
    shards = save_model(model, options.out, max_shard_bytes=15_000_000)
    weights_bytes = sum(p.stat().st_size for p in shards)
    runlog.close()
    plot_loss(read_log(options.out / "train_log.jsonl"), options.out / "loss_curve.png")

    summary = {
        "name": options.name,
        "headline": _headline(device, options.budget_minutes),
        "hardware": _hardware(device),
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": config.to_dict(),
        "parameters": model.num_parameters(),
        "active_parameters": active_parameters(config, model.num_parameters()),
        "save_dtype": preset.save_dtype,
        "weights_bytes": weights_bytes,
        "seq_len": preset.seq_len,
        "batch_size": preset.batch_size,
        "fim_rate": options.fim.rate,
        "stages": [r.__dict__ for r in results],
        "tokens_seen": trainer.tokens_seen,
        "train_tokens": len(train_stream),
        "budget_minutes": options.budget_minutes,
        "seconds_per_step": seconds_per_step,
        "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.monotonic() - t_start, 1),
        "corpus": corpus.manifest,
        "eval": figures,
        "samples": [s.__dict__ for s in samples],
        "command": options.command,
        "preset": preset.to_dict(),
    }
    (options.out / "MODEL_CARD.md").write_text(model_card(summary, samples), encoding="utf-8")
    slim = {k: v for k, v in summary.items() if k != "corpus"}
    (options.out / "metrics.json").write_text(
        json.dumps(slim, indent=2, default=str) + "\n", encoding="utf-8"
    )
    total_bytes = sum(p.stat().st_size for p in options.out.iterdir() if p.is_file())
    if total_bytes > MAX_SHIPPED_BYTES:
        log.warning(
            "%s holds %d bytes, over the %d that may ship in the package",
            options.out,
            total_bytes,
            MAX_SHIPPED_BYTES,
        )
    return summary


def evaluate(model: GlmMoeDsaForCausalLM, held_stream: np.ndarray, preset: Preset) -> dict[str, Any]:
    """Held-out perplexity dense vs DSA at the training and the evaluation context, and indexer recall."""
    figures: dict[str, Any] = {"table": []}
    notes = []
    topk = model.config.index_topk
    for length in dict.fromkeys((preset.seq_len, preset.eval_seq_len)):
        rows = pack(held_stream, length)[: preset.eval_sequences]
        if len(rows) == 0:
            notes.append(
                f"The held-out packages hold fewer than {length + 1} tokens: nothing measured at {length}."
            )
            continue
        dense = perplexity(model, rows, dense=True)
        dsa = perplexity(model, rows, dense=False)
        figures[f"ppl_dense_{length}"] = dense
        figures[f"ppl_dsa_{length}"] = dsa
        figures[f"sequences_{length}"] = len(rows)
        figures["table"] += [
            (f"perplexity, dense attention, {length} tokens ({len(rows)} sequences)", f"{dense:.3f}"),
            (f"perplexity, DSA top-{topk}, {length} tokens", f"{dsa:.3f}"),
            (
                f"DSA / dense perplexity at {length} tokens",
                f"{dsa / dense:.4f} ({(dsa / dense - 1) * 100:+.2f}%)",
            ),
        ]
        if length > topk:
            recall = indexer_recall(model, rows[: min(len(rows), 4)])
            figures[f"indexer_recall_{length}"] = recall["mean"]
            figures[f"indexer_recall_per_layer_{length}"] = recall["per_layer"]
            figures["table"].append(
                (
                    f"indexer recall of dense attention mass at top-{topk}, {length} tokens",
                    f"{recall['mean']:.4f}",
                )
            )
    if preset.eval_seq_len > preset.seq_len:
        notes.append(
            f"Trained at {preset.seq_len} tokens: figures at {preset.eval_seq_len} tokens measure "
            "extrapolation to a longer context than the model saw."
        )
    notes.append(
        "Recall: share of the dense attention mass (summed over heads, normalised) on the indexer's "
        "selected keys, averaged over queries with more causal keys than top-k, over all layers."
    )
    figures["note"] = " ".join(notes)
    return figures


def _headline(device: torch.device, minutes: float) -> str:
    if device.type == "cuda":
        return (
            f"The project's embedded default code model, trained from scratch on one GPU in about "
            f"{minutes:g} minutes of training."
        )
    return (
        f"**CPU stop-gap.** Trained from scratch on a CPU in about {minutes:g} minutes while no GPU was "
        "available: a small model that has seen little data. It writes plausible-looking Python at best; "
        "expect weak completions. The one-command GPU run (`scripts/gpu_train.sh`) replaces it."
    )


def _hardware(device: torch.device) -> str:
    if device.type == "cuda":
        return f"GPU: {torch.cuda.get_device_name(device)}, bf16 autocast, torch {torch.__version__}"
    return (
        f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s) "
        f"({os.cpu_count()} cores, shared), fp32, torch {torch.__version__}"
    )
