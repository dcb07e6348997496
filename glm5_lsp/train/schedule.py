"""How long each stage runs and the learning rate at each step.

The three stages of DeepSeek-V3.2's DSA training, scaled down: ``dense`` (dense attention, the
indexer idle), ``indexer_warmup`` (everything frozen but the indexer, trained by KL towards the
dense attention), ``sparse`` (attention over the indexer's top-k). A wall-clock budget is split
between them by fixed shares, and each stage's share becomes a step count from its measured step
time (:func:`plan_stages`). Each stage has its own warm-up + cosine schedule (:func:`lr_at`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STAGES: tuple[str, ...] = ("dense", "indexer_warmup", "sparse")


@dataclass(frozen=True)
class StageShares:
    """Shares of the training budget per stage (they must sum to 1)."""

    dense: float = 0.80
    indexer_warmup: float = 0.05
    sparse: float = 0.15

    def __post_init__(self) -> None:
        values = [getattr(self, s) for s in STAGES]
        if any(v < 0 for v in values) or not math.isclose(sum(values), 1.0, abs_tol=1e-6):
            raise ValueError(f"stage shares must be non-negative and sum to 1, got {values}")


@dataclass(frozen=True)
class StagePlan:
    """Steps and the seconds they are expected to take, per stage."""

    steps: dict[str, int]
    seconds_per_step: dict[str, float]
    budget_seconds: float

    def expected_seconds(self, stage: str) -> float:
        return self.steps[stage] * self.seconds_per_step[stage]

    def to_dict(self) -> dict:
        return {
            "steps": dict(self.steps),
            "seconds_per_step": dict(self.seconds_per_step),
            "budget_seconds": self.budget_seconds,
        }


def plan_stages(
    budget_seconds: float,
    seconds_per_step: dict[str, float],
    shares: StageShares = StageShares(),
    min_steps: int = 1,
    max_steps: dict[str, int] | None = None,
) -> StagePlan:
    """Turn a training budget and measured step times into step counts per stage.

    Each stage gets ``floor(share * budget / step_time)`` steps, at least ``min_steps`` (so every
    stage runs, even on a budget too small for its share), at most ``max_steps[stage]`` if given.
    """
    if budget_seconds <= 0:
        raise ValueError(f"the training budget must be positive, got {budget_seconds} s")
    steps: dict[str, int] = {}
    for stage in STAGES:
        t = seconds_per_step[stage]
        if t <= 0:
            raise ValueError(f"measured step time for {stage} must be positive, got {t}")
        n = max(min_steps, int(getattr(shares, stage) * budget_seconds / t))
        if max_steps and stage in max_steps:
            n = min(n, max_steps[stage])
        steps[stage] = n
    return StagePlan(steps, dict(seconds_per_step), budget_seconds)


def lr_at(step: int, total: int, peak: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio * peak`` at ``total``."""
    if total <= 0:
        raise ValueError("total steps must be positive")
    warmup = min(warmup, max(total - 1, 0))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
