"""The learning rate at a step: linear warm-up, then constant, cosine or linear decay to zero."""

from __future__ import annotations

import math


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
