"""Continued training: more data for a trained model, in runs that stop and resume anywhere.

A run starts from a model folder (the shipped one by default) with a fresh optimizer and a short
warm-up, or resumes its own last checkpoint. It reads the whole permissive corpus as a stream
(``stream.py``), from the position the starting weights record (so a new session reads what the
last one did not), and trains every parameter: most steps dense (the cheaper path, which leaves the
indexers alone), every ``sparse_every``-th step sparse (cross-entropy through DSA's top-k, plus the
indexers' KL towards dense attention), so the indexer keeps following the attention it serves.

The learning rate warms up over ``warmup_steps`` of each run, then follows an inverse square root of
the steps taken since the first continued run (``schedule_step`` carries across runs and sessions).
Two exponential moving averages of the weights are kept beside them: a short one (``ema_decay``,
about 500 steps) and a slow one (``slow_ema_decay``, about 3,000 steps: 14M tokens), since averaging
the weights over a longer stretch of the run measured better still (the shipped weights and the run's
short average 13M tokens later, half each: held-out perplexity 11.76 and 11.81 -> 11.47); promotion
(``promote.py``) measures them all and ships the best.

A run folder holds:

    run.json             the run's settings, fixed when it starts
    corpus_files.json    the documents it reads (so a resumed run reads exactly the same stream)
    heldout_files.json   the held-out packages' documents, for promotion's measurements
    corpus_manifest.json what they are (packages, versions, licences)
    tokenizer.json       the starting model's tokenizer
    train_log.jsonl      every step, continued across resumes
    checkpoint/          model folder (config.json, model.safetensors, tokenizer.json) + ema.safetensors
                         + ema_slow.safetensors + optimizer.safetensors + state.json

A checkpoint is written every ``checkpoint_minutes`` (and on SIGTERM/SIGINT) into a new folder that
then replaces the old one, so a run killed at any moment loses at most one interval and never
leaves a torn checkpoint. Nothing in it is a pickle: tensors are safetensors, the rest JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from glm5_lsp.model import GlmMoeDsaForCausalLM, load_model, save_model
from glm5_lsp.model.loading import CheckpointError
from glm5_lsp.train.corpus import Corpus
from glm5_lsp.train.fim import FimConfig
from glm5_lsp.train.runlog import RunLog
from glm5_lsp.train.stream import CorpusStream, Position, StreamDoc, load_docs, save_docs
from glm5_lsp.train.tokenizer import load_tokenizer_json
from glm5_lsp.train.trainer import ExpertBalancer, next_token_loss, train_forward

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint"
SLOW_EMA = "ema_slow.safetensors"  # the slow moving average, beside ema.safetensors
STATE_VERSION = 1


@dataclass(frozen=True)
class ContinueConfig:
    """A continued run's settings (``run.json``); none of them changes once the run has started."""

    init: str  # the model folder the run started from
    seq_len: int = 512
    batch_size: int = 8
    lr: float = 8e-4
    indexer_lr: float = 5e-4
    warmup_steps: int = 100
    decay_steps: int = 2000  # inverse-sqrt time scale: the rate is lr / sqrt(steps / decay_steps) past it
    min_lr: float = 5e-5
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    balance_rate: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    sparse_every: int = 8  # every n-th step trains through DSA's selection and the indexers' KL (0: never)
    ema_decay: float = 0.998
    # The slow average (a run begun before it existed starts it from the short one when it resumes).
    slow_ema_decay: float = 0.9997
    fim_rate: float = 0.5
    seed: int = 0
    shard_bytes: int = 2_000_000
    # Where the starting weights left the stream, and how far their schedule had gone:
    start_position: dict = field(default_factory=lambda: Position().to_dict())
    start_schedule_step: int = 0
    start_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ContinueConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        return cls(**values)


def learning_rate(config: ContinueConfig, run_step: int, schedule_step: int, peak: float) -> float:
    """Warm-up over the run's first steps (its optimizer is fresh), then an inverse square root decay."""
    warm = min(1.0, (run_step + 1) / max(1, config.warmup_steps))
    decay = 1.0 / math.sqrt(max(1.0, schedule_step / max(1, config.decay_steps)))
    return max(config.min_lr * warm, peak * warm * decay)


def _groups(model: torch.nn.Module, config: ContinueConfig) -> list[dict]:
    groups: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}
    for name, param in model.named_parameters():
        groups.setdefault((".indexer." in name, param.dim() >= 2), []).append(param)
    return [
        {
            "params": params,
            "weight_decay": config.weight_decay if decay else 0.0,
            "peak_lr": config.indexer_lr if indexer else config.lr,
            "indexer": indexer,
            "lr": config.indexer_lr if indexer else config.lr,
        }
        for (indexer, decay), params in sorted(groups.items())
    ]


# -- checkpoints --------------------------------------------------------------------------------


@dataclass
class TrainState:
    """What a checkpoint records beside the tensors (``state.json``)."""

    run_step: int = 0  # optimizer steps taken in this run
    schedule_step: int = 0  # steps since the first continued run (the learning-rate clock)
    tokens: int = 0  # tokens this run trained on
    tokens_total: int = 0  # tokens the weights have seen in all (the starting model's, plus this run's)
    position: dict = field(default_factory=lambda: Position().to_dict())
    last_loss: float | None = None
    wall_seconds: float = 0.0  # training time in this run, across resumes
    merge_base: int | None = None  # tokens_total where this run last agreed with its pair (``merge.py``)

    @classmethod
    def from_dict(cls, data: dict) -> TrainState:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def save_checkpoint(
    run: Path,
    model: GlmMoeDsaForCausalLM,
    ema: dict[str, torch.Tensor],
    optimizer: torch.optim.Optimizer,
    state: TrainState,
    slow_ema: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a checkpoint beside the current one, then swap it in (never a torn checkpoint)."""
    fresh = run / (CHECKPOINT + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    save_model(model, fresh, max_shard_bytes=1 << 40)
    shutil.copy2(run / "tokenizer.json", fresh / "tokenizer.json")
    save_file({k: v.contiguous() for k, v in ema.items()}, str(fresh / "ema.safetensors"))
    if slow_ema is not None:
        save_file({k: v.contiguous() for k, v in slow_ema.items()}, str(fresh / SLOW_EMA))
    save_file(_optimizer_tensors(model, optimizer), str(fresh / "optimizer.safetensors"))
    write_state(fresh, state)
    return swap_in(run)


def write_state(folder: Path, state: TrainState) -> None:
    """``state`` as ``folder``'s ``state.json``."""
    (folder / "state.json").write_text(json.dumps({"version": STATE_VERSION, **asdict(state)}, indent=1) + "\n",
                                       encoding="utf-8")


def swap_in(run: Path) -> Path:
    """The checkpoint written beside the current one (``checkpoint.new``) takes its place; returns it."""
    final = run / CHECKPOINT
    fresh = run / (CHECKPOINT + ".new")
    old = run / (CHECKPOINT + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    fresh.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _optimizer_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    names = {param: name for name, param in model.named_parameters()}
    out: dict[str, torch.Tensor] = {}
    for param, slot in optimizer.state.items():
        name = names[param]
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{name}:{key}"] = slot[key].detach().contiguous()
        out[f"{name}:step"] = torch.as_tensor(slot["step"], dtype=torch.float64).reshape(())
    return out


def _load_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, file: Path) -> None:
    params = dict(model.named_parameters())
    slots: dict[str, dict[str, torch.Tensor]] = {}
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types for a corrupt header
        raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None
    with handle:
        for key in handle.keys():  # noqa: SIM118 - a safetensors handle is not iterable
            name, _, part = key.rpartition(":")
            if name not in params or part not in ("exp_avg", "exp_avg_sq", "step"):
                raise CheckpointError(f"{file}: unexpected tensor {key!r}")
            try:
                slots.setdefault(name, {})[part] = handle.get_tensor(key)
            except Exception as exc:  # noqa: BLE001 - any read failure names the tensor
                raise CheckpointError(f"{file}: tensor {key!r} cannot be read ({exc})") from None
    for name, slot in slots.items():
        if set(slot) != {"exp_avg", "exp_avg_sq", "step"}:
            raise CheckpointError(f"{file}: optimizer state of {name!r} is incomplete ({sorted(slot)})")
        param = params[name]
        for part in ("exp_avg", "exp_avg_sq"):
            if slot[part].shape != param.shape:
                raise CheckpointError(
                    f"{file}: tensor {name + ':' + part!r} has shape {list(slot[part].shape)}, "
                    f"expected {list(param.shape)}"
                )
        optimizer.state[param] = {
            "step": slot["step"].to(torch.float32),
            "exp_avg": slot["exp_avg"].to(param),
            "exp_avg_sq": slot["exp_avg_sq"].to(param),
        }


def _load_ema(model: torch.nn.Module, file: Path) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    ema: dict[str, torch.Tensor] = {}
    try:
        handle = safe_open(str(file), framework="pt", device="cpu")
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{file}: not a readable safetensors file ({exc})") from None
    with handle:
        for key in handle.keys():  # noqa: SIM118
            if key not in params:
                raise CheckpointError(f"{file}: unexpected tensor {key!r}")
            tensor = handle.get_tensor(key)
            if tensor.shape != params[key].shape:
                raise CheckpointError(f"{file}: tensor {key!r} has shape {list(tensor.shape)}, expected "
                                      f"{list(params[key].shape)}")
            ema[key] = tensor.to(params[key])
    missing = sorted(set(params) - set(ema))
    if missing:
        raise CheckpointError(f"{file} is missing tensor(s): {', '.join(missing[:5])}")
    return ema


def read_state(checkpoint: Path) -> TrainState:
    file = checkpoint / "state.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{file} is missing: {checkpoint} is not a complete checkpoint") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{file}: not readable JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise CheckpointError(f"{file}: not a version-{STATE_VERSION} training state")
    try:
        state = TrainState.from_dict(data)
        Position.from_dict(state.position)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: {exc}") from None
    return state


# -- the run ------------------------------------------------------------------------------------


@dataclass
class RunLimits:
    """When a run stops (whichever comes first) and how often it checkpoints."""

    minutes: float | None = None  # None: until signalled
    steps: int | None = None  # this many optimizer steps in this invocation
    until_step: int | None = None  # until the run has taken this many steps in all (across resumes)
    checkpoint_minutes: float = 5.0
    checkpoint_steps: int | None = None  # also every n steps (tests)
    log_every: int = 1


def start_run(run: Path, config: ContinueConfig, corpus: Corpus) -> None:
    """Create a run folder: settings, the document list, the manifest, the tokenizer, the log."""
    if (run / "run.json").exists():
        raise FileExistsError(f"{run} already holds a run; resume it with --resume {run}")
    init = Path(config.init)
    for name in ("config.json", "tokenizer.json"):
        if not (init / name).is_file():
            raise FileNotFoundError(f"{init} has no {name}: not a model folder")
    run.mkdir(parents=True, exist_ok=True)
    docs = [StreamDoc(d.package, d.relpath, str(d.path), d.digest, d.size) for d in corpus.train]
    if not docs:
        raise RuntimeError("the corpus is empty: no permissively licensed Python source passed the filters")
    save_docs(docs, run / "corpus_files.json")
    save_docs([StreamDoc(d.package, d.relpath, str(d.path), d.digest, d.size) for d in corpus.heldout],
              run / "heldout_files.json")
    corpus.write_manifest(run / "corpus_manifest.json")
    shutil.copy2(init / "tokenizer.json", run / "tokenizer.json")
    (run / "run.json").write_text(json.dumps(config.to_dict(), indent=1) + "\n", encoding="utf-8")


def train(run: Path, limits: RunLimits, stop_on_signals: bool = True) -> TrainState:
    """Train the run in ``run`` from its checkpoint (or its starting weights) until a limit or a signal."""
    try:
        config = ContinueConfig.from_dict(json.loads((run / "run.json").read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise FileNotFoundError(f"{run} holds no run (no run.json); start one with --continue-from") from None
    except (json.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"{run / 'run.json'}: not a run's settings ({exc})") from None
    tokenizer = load_tokenizer_json(run / "tokenizer.json")
    docs = load_docs(run / "corpus_files.json")
    stream = CorpusStream(
        docs, tokenizer, seq_len=config.seq_len, batch_size=config.batch_size, seed=config.seed,
        fim=FimConfig(rate=config.fim_rate), shard_bytes=config.shard_bytes,
    )
    checkpoint = run / CHECKPOINT
    if not checkpoint.exists() and (run / (CHECKPOINT + ".new") / "state.json").is_file():
        (run / (CHECKPOINT + ".new")).rename(checkpoint)  # killed between the two renames of a swap
    resuming = checkpoint.exists()
    if resuming:
        state = read_state(checkpoint)
        model = load_model(checkpoint)
    else:
        state = TrainState(
            schedule_step=config.start_schedule_step, tokens_total=config.start_tokens,
            position=dict(config.start_position),
        )
        model = load_model(config.init)
    model.train()
    groups = _groups(model, config)
    optimizer = torch.optim.AdamW(groups, betas=config.betas, foreach=False)
    if resuming:
        _load_optimizer(model, optimizer, checkpoint / "optimizer.safetensors")
        ema = _load_ema(model, checkpoint / "ema.safetensors")
        if (checkpoint / SLOW_EMA).is_file():
            slow_ema = _load_ema(model, checkpoint / SLOW_EMA)
        else:
            log.info("%s: no slow average yet; it starts from the short one", checkpoint)
            slow_ema = {name: t.clone() for name, t in ema.items()}
    else:
        ema = {name: p.detach().clone() for name, p in model.named_parameters()}
        slow_ema = {name: t.clone() for name, t in ema.items()}
    balancer = ExpertBalancer(model, config.balance_rate)
    runlog = RunLog(run / "train_log.jsonl")
    runlog.write("resume" if resuming else "start_continued", **asdict(state), config=config.to_dict(),
                 threads=torch.get_num_threads(), pid=os.getpid())

    stop = {"signal": None}
    previous_handlers = {}
    if stop_on_signals:
        def on_signal(signum, _frame):  # finish the step, checkpoint, return
            stop["signal"] = signal.Signals(signum).name

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[sig] = signal.signal(sig, on_signal)

    params = [p for g in groups for p in g["params"]]
    indexer_params = [p for g in groups if g["indexer"] for p in g["params"]]
    start = time.monotonic()
    last_checkpoint = start
    taken = 0
    reason = "limit"
    try:
        for rows_np, after in stream.batches(Position.from_dict(state.position)):
            if stop["signal"]:
                reason = stop["signal"]
                break
            if limits.steps is not None and taken >= limits.steps:
                break
            if limits.until_step is not None and state.run_step >= limits.until_step:
                break
            if limits.minutes is not None and time.monotonic() - start >= limits.minutes * 60:
                break
            sparse = config.sparse_every > 0 and (state.schedule_step + 1) % config.sparse_every == 0
            stage = "sparse" if sparse else "dense"
            for p in indexer_params:
                p.requires_grad_(sparse)
            rows = torch.from_numpy(rows_np).long()
            logits, kl = train_forward(model, rows[:, :-1], stage)
            lm = next_token_loss(logits, rows)
            loss = lm + kl.float() if sparse else lm
            if not torch.isfinite(loss):
                raise FloatingPointError(f"step {state.run_step}: loss is {float(lm)}; lower the learning rate")
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], config.grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(config, state.run_step, state.schedule_step, group["peak_lr"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            load = balancer.update()
            with torch.no_grad():
                for name, p in model.named_parameters():
                    ema[name].lerp_(p.detach(), 1.0 - config.ema_decay)
                    slow_ema[name].lerp_(p.detach(), 1.0 - config.slow_ema_decay)
            batch_tokens = rows.shape[0] * (rows.shape[1] - 1)
            state.run_step += 1
            state.schedule_step += 1
            state.tokens += batch_tokens
            state.tokens_total += batch_tokens
            state.position = after.to_dict()
            state.last_loss = round(float(lm.detach()), 5)
            taken += 1
            if taken % limits.log_every == 0:
                elapsed = time.monotonic() - start
                runlog.write(
                    "step", stage=stage, step=state.run_step, schedule_step=state.schedule_step,
                    tokens=state.tokens_total, loss=state.last_loss, indexer_kl=round(float(kl.detach()), 6),
                    lr=optimizer.param_groups[0]["lr"], grad_norm=round(float(grad_norm), 4),
                    expert_load_max_over_mean=round(load, 3),
                    tokens_per_s=round(taken * batch_tokens / max(elapsed, 1e-9), 1), **state.position,
                )
            now = time.monotonic()
            due_time = now - last_checkpoint >= limits.checkpoint_minutes * 60
            due_steps = limits.checkpoint_steps is not None and taken % limits.checkpoint_steps == 0
            if due_time or due_steps:
                state.wall_seconds += now - last_checkpoint
                last_checkpoint = now
                save_checkpoint(run, model, ema, optimizer, state, slow_ema)
                runlog.write("checkpoint", step=state.run_step, tokens=state.tokens_total, **state.position)
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        balancer.close()
    state.wall_seconds += time.monotonic() - last_checkpoint
    save_checkpoint(run, model, ema, optimizer, state, slow_ema)
    runlog.write("stop", reason=reason, step=state.run_step, tokens=state.tokens_total, **state.position)
    runlog.close()
    return state
