"""The run's steps and the learning rate at each: linear warm-up, then constant, cosine or
linear decay to zero."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddp_train.config import batch_per_rank


@dataclass(frozen=True)
class Steps:
    """How many optimizer steps an epoch and the run take, and each rank's share of a batch."""
    per_epoch: int
    total: int
    warmup: int
    batch_per_rank: int


def plan_steps(train_images: int, batch_size: int, world_size: int, epochs: int,
               warmup_epochs: float) -> Steps:
    """The last partial batch is dropped, so every rank takes the same number of steps."""
    per_epoch = train_images // batch_size
    return Steps(per_epoch, per_epoch * epochs, round(warmup_epochs * per_epoch),
                 batch_per_rank(batch_size, world_size))


def lr_at(step: int, total_steps: int, warmup_steps: int, peak: float, schedule: str) -> float:
    if warmup_steps > 0 and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if schedule == "cosine":
        return peak * 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return peak * (1.0 - progress)
    raise ValueError(f"unknown schedule {schedule!r}")
