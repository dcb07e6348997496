"""The training loop: next-token loss, DSA's three stages, AdamW with warm-up + cosine, clipping.

Stages (``train_forward``, see ``schedule.py``):

- ``dense``: every parameter but the indexers, loss = next-token cross-entropy.
- ``indexer_warmup``: only the indexers, loss = ``indexer_kl`` (KL from the head-summed, normalised
  dense attention to the indexer's distribution); the rest is frozen, so no backward runs through it.
- ``sparse``: everything, loss = cross-entropy + ``indexer_kl``. The model detaches the indexer's
  inputs, so the KL trains only the indexers and the cross-entropy only the rest, as in DeepSeek-V3.2.

Experts are balanced without an auxiliary loss, as DeepSeek-V3 does: after each step every router's
``e_score_correction_bias`` moves by ``balance_rate`` towards under-used experts.
On CUDA the step runs under bf16 autocast and, if asked, ``torch.compile``; on the CPU in fp32.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm5_lsp.model import GlmMoeDsaForCausalLM
from glm5_lsp.train.data import Batches
from glm5_lsp.train.runlog import RunLog
from glm5_lsp.train.schedule import STAGES, lr_at

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 2e-3
    indexer_lr: float = 1e-3
    warmup_steps: int = 30
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    sparse_lr_scale: float = 0.3  # the sparse stage continues training at a lower peak
    min_lr_ratio: float = 0.1
    balance_rate: float = 1e-3  # expert-bias step per update (0 turns balancing off)
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass
class StageResult:
    stage: str
    steps: int
    tokens: int
    seconds: float
    last_loss: float
    last_indexer_kl: float
    stopped_early: bool


def train_forward(
    model: GlmMoeDsaForCausalLM, input_ids: torch.Tensor, stage: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[B, T, V]`` and the indexer's KL for one training stage.

    The dense stage runs the runtime's fused dense path, ``model(ids, dense=True)`` (SDPA over expanded
    keys, no ``[B, H, T, T]`` scores kept for backward): the same function as
    ``forward_train(ids, "dense")`` (``test_train_loop`` checks logits and gradients agree), faster and
    leaner. The other stages need the dense attention probabilities or the indexer's selection, so
    they run ``forward_train``.
    """
    if stage == "dense":
        return model(input_ids, dense=True), torch.zeros((), device=input_ids.device)
    out = model.forward_train(input_ids, stage)
    return out.logits, out.indexer_kl


def next_token_loss(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits [B, T, V]`` against ``rows[:, 1:]`` (``rows [B, T + 1]``)."""
    targets = rows[:, 1:]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


class ExpertBalancer:
    """Auxiliary-loss-free load balancing: count each router's picks, nudge its selection bias."""

    def __init__(self, model: nn.Module, rate: float) -> None:
        self.rate = rate
        self.counts: dict[nn.Module, torch.Tensor] = {}
        self._hooks = []
        if rate > 0:
            for module in model.modules():
                if hasattr(module, "e_score_correction_bias") and hasattr(module, "n_experts"):
                    self._hooks.append(module.register_forward_hook(self._count))

    def _count(self, module: nn.Module, inputs, output) -> None:
        idx = output[0].detach()
        counts = torch.bincount(idx.reshape(-1), minlength=module.n_experts).float()
        self.counts[module] = self.counts.get(module, 0) + counts

    @torch.no_grad()
    def update(self) -> float:
        """Apply and reset the counts; returns the worst max/mean load ratio seen (1 = balanced)."""
        worst = 1.0
        for module, counts in self.counts.items():
            mean = counts.mean()
            if mean > 0:
                module.e_score_correction_bias.add_(
                    self.rate * torch.sign(mean - counts).to(module.e_score_correction_bias)
                )
                worst = max(worst, float(counts.max() / mean))
        self.counts.clear()
        return worst

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


def _is_indexer(name: str) -> bool:
    return ".indexer." in name


def _param_groups(model: nn.Module, stage: str, optim: OptimConfig) -> list[dict]:
    """Trainable parameters of a stage (others get ``requires_grad = False``), split for weight decay."""
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, param in model.named_parameters():
        indexer = _is_indexer(name)
        train = {"dense": not indexer, "indexer_warmup": indexer, "sparse": True}[stage]
        param.requires_grad_(train)
        if train:
            groups.setdefault((indexer, param.dim() >= 2), []).append(param)
    scale = optim.sparse_lr_scale if stage == "sparse" else 1.0
    out = []
    for (indexer, decay), params in sorted(groups.items()):
        peak = (optim.indexer_lr if indexer else optim.lr) * scale
        out.append(
            {
                "params": params,
                "weight_decay": optim.weight_decay if decay else 0.0,
                "peak_lr": peak,
                "lr": peak,
            }
        )
    return out


class Trainer:
    """Runs the stages over one stream of batches, logging every step to a :class:`RunLog`."""

    def __init__(
        self,
        model: GlmMoeDsaForCausalLM,
        batches: Batches,
        optim: OptimConfig,
        device: torch.device,
        runlog: RunLog,
        compile_model: bool = False,
        log_every: int = 1,
        max_compile_seconds: float = 90.0,
        micro_batch: int | None = None,
    ) -> None:
        self.model = model
        self.batches = batches
        self.optim = optim
        self.device = device
        self.runlog = runlog
        self.log_every = max(1, log_every)
        self.data_step = 0  # batches consumed so far, across stages (each stage sees new data)
        self.tokens_seen = 0
        self.balancer = ExpertBalancer(model, optim.balance_rate)
        self.max_compile_seconds = max_compile_seconds
        # The indexer stages keep dense attention probabilities and indexer scores for every
        # (query, key) pair: micro-batches bound that memory (gradient accumulation, same update).
        self.micro_batch = micro_batch
        self._forward: Callable = train_forward
        self._compiled = False
        if compile_model:
            self._forward = torch.compile(train_forward)
            self._compiled = True

    def _autocast(self):
        if self.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _rows(self, step: int) -> torch.Tensor:
        rows = torch.from_numpy(self.batches.batch(step)).long()
        return rows.to(self.device, non_blocking=True)

    def _loss(self, rows: torch.Tensor, stage: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with self._autocast():
            try:
                logits, kl = self._forward(self.model, rows[:, :-1], stage)
            except Exception as exc:
                if not self._compiled:
                    raise
                log.warning("torch.compile failed (%s); continuing without it", exc)
                self.runlog.write("note", message=f"torch.compile failed, eager fallback: {exc}"[:500])
                self._forward, self._compiled = train_forward, False
                logits, kl = self._forward(self.model, rows[:, :-1], stage)
            lm = next_token_loss(logits, rows)
            kl = kl.float()
        total = kl if stage == "indexer_warmup" else lm + kl if stage == "sparse" else lm
        return total, lm.detach(), kl.detach()

    def _backward(self, rows: torch.Tensor, stage: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward over one batch, in micro-batches where the stage asks for them.

        Gradients (and the returned mean cross-entropy and KL) equal those of the whole batch at once.
        """
        micro = self.micro_batch if stage != "dense" and self.micro_batch else rows.shape[0]
        lm_sum = kl_sum = torch.zeros((), device=rows.device)
        for chunk in rows.split(micro):
            weight = chunk.shape[0] / rows.shape[0]
            loss, lm, kl = self._loss(chunk, stage)
            (loss * weight).backward()
            lm_sum = lm_sum + lm * weight
            kl_sum = kl_sum + kl * weight
        return lm_sum, kl_sum

    def measure(self, stage: str, steps: int = 2, warmup: int = 1) -> float:
        """Seconds per training step of ``stage`` (forward + backward, no update: the weights stay as they are)."""
        self.model.train()
        _param_groups(self.model, stage, self.optim)
        times = []
        for i in range(warmup + steps):
            rows = self._rows(i)
            self._sync()
            start = time.perf_counter()
            self._backward(rows, stage)
            self._sync()
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times.append(elapsed)
            elif self._compiled and elapsed > self.max_compile_seconds:
                # A slow compile would eat the budget again for every later stage's graph: stay eager.
                self.runlog.write(
                    "note", message=f"compiling {stage} took {elapsed:.0f} s; later stages run eager"
                )
                self._forward, self._compiled = train_forward, False
            self.model.zero_grad(set_to_none=True)
        for p in self.model.parameters():
            p.requires_grad_(True)
        self.balancer.counts.clear()
        return sorted(times)[len(times) // 2]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run_stage(self, stage: str, steps: int, seconds: float | None = None) -> StageResult:
        """Train ``stage`` for ``steps`` steps or, given ``seconds``, for as many as fit in that time.

        With a time budget the step count, hence the cosine schedule, is re-sized from the real
        step time (optimizer and logging included) after the first ``max(3, steps // 20)`` steps and
        again every as many steps, so a machine that slows down or speeds up mid-stage is followed;
        a stage still running at 1.25x its time is cut short.
        """
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
        self.model.train()
        groups = _param_groups(self.model, stage, self.optim)
        params = [p for g in groups for p in g["params"]]
        fused = self.device.type == "cuda"
        opt = torch.optim.AdamW(groups, betas=self.optim.betas, fused=fused)
        warmup = min(self.optim.warmup_steps, max(1, steps // 10))
        calibrate = max(3, steps // 20) if seconds is not None else None
        self.balancer.counts.clear()  # forget picks counted outside training (evaluation, other stages)
        start = time.monotonic()
        tokens = 0
        lm = kl = torch.zeros(())
        step = 0
        stopped = False
        while step < steps:
            elapsed = time.monotonic() - start
            if seconds is not None and step > 0 and elapsed > 1.25 * seconds:
                stopped = True
                break
            if calibrate is not None and step >= calibrate and step % calibrate == 0:
                per_step = elapsed / step
                resized = max(step + 1, step + int((seconds - elapsed) / per_step))
                if resized != steps:
                    self.runlog.write(
                        "resize",
                        stage=stage,
                        at_step=step,
                        steps=resized,
                        seconds_per_step=round(per_step, 5),
                    )
                steps = resized
            for group in opt.param_groups:
                group["lr"] = lr_at(step, steps, group["peak_lr"], warmup, self.optim.min_lr_ratio)
            rows = self._rows(self.data_step)
            lm, kl = self._backward(rows, stage)
            if not torch.isfinite(lm + kl):
                raise FloatingPointError(
                    f"{stage} step {step}: loss is {float(lm)} (indexer KL {float(kl)}); lower the learning rate"
                )
            grad_norm = torch.nn.utils.clip_grad_norm_(params, self.optim.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            load = self.balancer.update() if stage != "indexer_warmup" else 1.0
            batch_tokens = rows.shape[0] * (rows.shape[1] - 1)
            tokens += batch_tokens
            self.tokens_seen += batch_tokens
            self.data_step += 1
            if step % self.log_every == 0 or step == steps - 1:
                elapsed = time.monotonic() - start
                self.runlog.write(
                    "step",
                    stage=stage,
                    step=step,
                    of=steps,
                    data_step=self.data_step,
                    tokens=self.tokens_seen,
                    loss=round(float(lm), 5),
                    indexer_kl=round(float(kl), 6),
                    lr=opt.param_groups[0]["lr"],
                    grad_norm=round(float(grad_norm), 4),
                    expert_load_max_over_mean=round(load, 3),
                    tokens_per_s=round(tokens / max(elapsed, 1e-9), 1),
                )
            step += 1
        done = step
        seconds = time.monotonic() - start
        for p in self.model.parameters():
            p.requires_grad_(True)
        result = StageResult(stage, done, tokens, seconds, float(lm), float(kl), stopped)
        self.runlog.write("stage_end", **result.__dict__)
        if not math.isfinite(result.last_loss):
            raise FloatingPointError(f"{stage}: training diverged")
        return result
