"""Promotion: measure a continued run against the shipped model and ship it only where it is better.

The candidates, the run's weights, their moving averages (the short one and, where the checkpoint
has it, the slow one) and the shipped weights averaged half and half with the short moving average
(the weights averaged across promotions: they measured better than either), are measured on the same
held-out rows as the model in the package, in one process: the held-out packages of the first run
(whole packages the corpus never trains on), cut into 512-token rows. The decision uses 64 rows (32k
tokens: the first 8 alone, the model card's figure since the first run, move by a few percent between
checkpoints of the same quality); the card reports both. When the best of them beats the shipped model by
``min_gain``, it replaces the package's weights (same shape and tokenizer, so everything that loads
the embedded model keeps working), and the model card, metrics, log and loss curve say what it has
seen, with one history row per promotion. ``metrics.json``'s ``continued`` block records where the
stream stands, so the next session's run reads on from there.
"""

from __future__ import annotations

import copy
import json
import logging
import platform
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from glm5_lsp.model import GlmMoeDsaForCausalLM, load_model, load_tokenizer, save_model
from glm5_lsp.train.continued import CHECKPOINT, SLOW_EMA, ContinueConfig, _load_ema, read_state
from glm5_lsp.train.data import encode_documents, pack
from glm5_lsp.train.fim import FimConfig
from glm5_lsp.train.metrics import perplexity
from glm5_lsp.train.pipeline import active_parameters, evaluate
from glm5_lsp.train.presets import Preset, get_preset
from glm5_lsp.train.report import model_card, plot_loss
from glm5_lsp.train.runlog import read_log
from glm5_lsp.train.samples import greedy_samples
from glm5_lsp.train.stream import StreamDoc, load_docs
from glm5_lsp.train.tokenizer import load_tokenizer_json

log = logging.getLogger(__name__)

DECISION_ROWS = 64
LOG_EVERY = 10  # the package keeps every 10th step of a continued run's log (the run folder keeps all)


@dataclass
class Measured:
    label: str
    ppl_64: float  # DSA perplexity over DECISION_ROWS rows
    ppl_8: float  # DSA perplexity over the first 8 (the card's figure)


def heldout_rows(docs: list[StreamDoc], tokenizer_json: Path, seq_len: int) -> np.ndarray:
    """The held-out packages as rows of ``seq_len + 1`` tokens, exactly as the first run cut them."""
    tokenizer = load_tokenizer_json(tokenizer_json)
    texts = [Path(d.path).read_text(encoding="utf-8") for d in docs]
    stream = encode_documents(texts, tokenizer, FimConfig(rate=0.0), 0, seq_len * 3)
    return pack(stream, seq_len)


def measure(model: GlmMoeDsaForCausalLM, rows: np.ndarray, label: str) -> Measured:
    torch.manual_seed(0)
    return Measured(label, perplexity(model, rows[:DECISION_ROWS], dense=False),
                    perplexity(model, rows[:8], dense=False))


def with_ema(model: GlmMoeDsaForCausalLM, checkpoint: Path, file: str = "ema.safetensors") -> GlmMoeDsaForCausalLM:
    """A copy of ``model`` whose parameters are the checkpoint's moving average ``file`` (buffers as they are)."""
    ema = _load_ema(model, checkpoint / file)
    averaged = load_model(checkpoint)
    with torch.no_grad():
        for name, param in averaged.named_parameters():
            param.copy_(ema[name])
    return averaged.eval()


def halfway(shipped: GlmMoeDsaForCausalLM, averaged: GlmMoeDsaForCausalLM) -> GlmMoeDsaForCausalLM | None:
    """A copy of ``averaged`` whose parameters are the mean of its and ``shipped``'s: the weights
    averaged across promotions; None where the two do not have the same parameters."""
    theirs = dict(shipped.named_parameters())
    ours = dict(averaged.named_parameters())
    if theirs.keys() != ours.keys() or any(theirs[n].shape != p.shape for n, p in ours.items()):
        return None
    out = copy.deepcopy(averaged)
    with torch.no_grad():
        for name, param in out.named_parameters():
            param.add_(theirs[name].to(param)).mul_(0.5)
    return out.eval()


@dataclass
class Promotion:
    promoted: bool
    shipped: Measured
    candidates: list[Measured]
    chosen: str | None
    tokens_total: int
    message: str


def promote(run: Path, target: Path, *, min_gain: float = 0.0, dry_run: bool = False) -> Promotion:
    """Measure ``run``'s checkpoint (weights and average) against ``target``; replace it when better."""
    checkpoint = run / CHECKPOINT
    state = read_state(checkpoint)
    if not (target / "metrics.json").is_file():
        raise FileNotFoundError(f"{target} has no metrics.json: not a model folder written by glm5-lsp train")
    config = ContinueConfig.from_dict(json.loads((run / "run.json").read_text(encoding="utf-8")))
    heldout = load_docs(run / "heldout_files.json")
    rows = heldout_rows(heldout, run / "tokenizer.json", config.seq_len)
    if len(rows) < DECISION_ROWS:
        raise RuntimeError(f"the held-out packages give only {len(rows)} rows of {config.seq_len} tokens")
    shipped_model = load_model(target)
    shipped = measure(shipped_model, rows, "shipped")
    raw = load_model(checkpoint)
    averaged = with_ema(raw, checkpoint)
    models = {"weights": raw, "moving average": averaged}
    if (checkpoint / SLOW_EMA).is_file():
        models["slow moving average"] = with_ema(raw, checkpoint, SLOW_EMA)
    across = halfway(shipped_model, averaged)
    if across is not None:
        models["shipped weights and moving average, half each"] = across
    candidates = [measure(model, rows, label) for label, model in models.items()]
    best = min(candidates, key=lambda m: m.ppl_64)
    gain = 1.0 - best.ppl_64 / shipped.ppl_64
    if gain <= min_gain:
        return Promotion(False, shipped, candidates, None, state.tokens_total,
                         f"not promoted: best {best.label} {best.ppl_64:.3f} against the shipped {shipped.ppl_64:.3f} "
                         f"(gain {gain:+.2%}, needs more than {min_gain:.2%})")
    if dry_run:
        return Promotion(False, shipped, candidates, best.label, state.tokens_total,
                         f"would promote the {best.label}: {shipped.ppl_64:.3f} -> {best.ppl_64:.3f}")
    _write(run, target, models[best.label], best, shipped, state, config)
    return Promotion(True, shipped, candidates, best.label, state.tokens_total,
                     f"promoted the {best.label}: held-out perplexity {shipped.ppl_64:.3f} -> {best.ppl_64:.3f} "
                     f"({DECISION_ROWS} rows; {shipped.ppl_8:.3f} -> {best.ppl_8:.3f} on the card's 8)")


def _write(run: Path, target: Path, model: GlmMoeDsaForCausalLM, best: Measured, shipped: Measured,
           state, config: ContinueConfig) -> None:
    metrics = json.loads((target / "metrics.json").read_text(encoding="utf-8"))
    preset = _preset(metrics)
    config_dict = model.config.to_dict()
    heldout = load_docs(run / "heldout_files.json")
    tokenizer = load_tokenizer_json(run / "tokenizer.json")
    held_stream = encode_documents([Path(d.path).read_text(encoding="utf-8") for d in heldout], tokenizer,
                                   FimConfig(rate=0.0), 0, preset.seq_len * 3)
    figures = evaluate(model, held_stream, preset)
    samples = greedy_samples(model, load_tokenizer(run))
    history = metrics.get("history") or [_first_entry(metrics)]
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    history.append({
        "date": now, "tokens_seen": state.tokens_total, "weights": best.label,
        "ppl_dsa_512_64rows": round(best.ppl_64, 3), "ppl_dsa_512": round(best.ppl_8, 3),
        "previous_ppl_dsa_512_64rows": round(shipped.ppl_64, 3), "run_steps": state.run_step,
        "train_hours": round(state.wall_seconds / 3600, 2), "hardware": _hardware(),
    })
    manifest = json.loads((run / "corpus_manifest.json").read_text(encoding="utf-8"))
    metrics.update({
        "headline": _headline(state.tokens_total, best.ppl_8),
        "tokens_seen": state.tokens_total,
        "config": config_dict,
        "parameters": model.num_parameters(),
        "active_parameters": active_parameters(model.config, model.num_parameters()),
        "eval": figures,
        "samples": [s.__dict__ for s in samples],
        "history": history,
        "continued": {
            "position": state.position, "schedule_step": state.schedule_step, "seed": config.seed,
            "shard_bytes": config.shard_bytes, "fim_rate": config.fim_rate, "seq_len": config.seq_len,
            "batch_size": config.batch_size, "lr": config.lr, "sparse_every": config.sparse_every,
            "ema_decay": config.ema_decay, "slow_ema_decay": config.slow_ema_decay, "corpus_files": manifest["totals"]["train_files"],
            "corpus_bytes": manifest["totals"]["train_bytes"],
            "command": "scripts/cpu_train.sh (glm5-lsp train --continue-from / --resume, then --promote)",
        },
    })
    metrics.pop("humaneval", None)  # measured for the previous weights: re-measured after promotion
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        staged = Path(tmp)
        model.to("cpu", dtype=getattr(torch, metrics.get("save_dtype", "float32")))
        shards = save_model(model, staged, max_shard_bytes=15_000_000)
        metrics["weights_bytes"] = sum(p.stat().st_size for p in shards)
        shutil.copy2(run / "corpus_manifest.json", staged / "corpus_manifest.json")
        old_log = target / "train_log.jsonl"
        lines = old_log.read_text(encoding="utf-8").splitlines() if old_log.is_file() else []
        lines += _thinned(run / "train_log.jsonl", _logged_upto(lines))
        lines.append(json.dumps({"kind": "eval", "stage": "continued", "tokens": state.tokens_total,
                                 "heldout_loss": round(float(np.log(best.ppl_8)), 4), "promoted": now}))
        (staged / "train_log.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        plot_loss(read_log(staged / "train_log.jsonl"), staged / "loss_curve.png")
        (staged / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str) + "\n", encoding="utf-8")
        summary = {**metrics, "corpus": manifest}
        (staged / "MODEL_CARD.md").write_text(model_card(summary, samples), encoding="utf-8")
        for old in target.glob("model*.safetensors"):
            if not (staged / old.name).exists():
                old.unlink()
        for file in staged.iterdir():
            file.replace(target / file.name)


def _logged_upto(lines: list[str]) -> int:
    """The most tokens any record already in the package's log reached (a resumed promotion adds after it)."""
    best = 0
    for line in lines:
        try:
            best = max(best, int(json.loads(line).get("tokens") or 0))
        except (json.JSONDecodeError, TypeError, ValueError):
            continue
    return best


def _thinned(path: Path, after_tokens: int) -> list[str]:
    out = []
    for record in read_log(path):
        if record.get("kind") != "step" or int(record.get("tokens", 0)) <= after_tokens:
            continue
        if record.get("step", 0) % LOG_EVERY == 0:
            out.append(json.dumps(record))
    return out


def _preset(metrics: dict[str, Any]) -> Preset:
    data = metrics.get("preset")
    if isinstance(data, dict):
        try:
            return Preset(**data)
        except TypeError:
            pass
    return get_preset("cpu")


def _first_entry(metrics: dict[str, Any]) -> dict[str, Any]:
    ev = metrics.get("eval", {})
    return {"date": metrics.get("created"), "tokens_seen": metrics.get("tokens_seen"), "weights": "first run",
            "ppl_dsa_512": ev.get("ppl_dsa_512"), "ppl_dsa_512_64rows": None,
            "train_hours": round(float(metrics.get("train_seconds", 0)) / 3600, 2),
            "hardware": metrics.get("hardware")}


def _hardware() -> str:
    return f"CPU: {platform.machine()}, {torch.get_num_threads()} thread(s), fp32, torch {torch.__version__}"


def _headline(tokens: int, ppl: float) -> str:
    return (
        f"**CPU-trained, still small.** Trained from scratch on a CPU for 40 minutes, then continued in the "
        f"background on the whole permissive corpus at low priority: {tokens:,} tokens seen in all, held-out "
        f"perplexity {ppl:.1f} (512 tokens, DSA). It writes weak completions; the workspace memory and the "
        "checkers carry much of what the editor shows. The one-command GPU run (`scripts/gpu_train.sh`) "
        "replaces it when a GPU is at hand."
    )


__all__ = ["Promotion", "heldout_rows", "promote"]
