"""Evaluation on the test set, split across ranks with every sample counted exactly once, and
when its accuracy is good enough to stop early.

Each rank takes a contiguous shard (sizes differ by at most one); correct, count and loss
sums are all-reduced, so the accuracy is exactly the full test set's on every rank, and every
rank decides alike whether to stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ddp_train.recipe.data import Split, normalize
from ddp_train.distributed import all_reduce_sum


@dataclass(frozen=True)
class EvalResult:
    correct: int
    total: int
    loss_sum: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.total

    @property
    def loss(self) -> float:
        return self.loss_sum / self.total


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    return n * rank // world_size, n * (rank + 1) // world_size


@torch.no_grad()
def evaluate(model: torch.nn.Module, test_set: Split, rank: int, world_size: int, batch_size: int,
             autocast_dtype: Optional[torch.dtype], tta: bool) -> EvalResult:
    was_training = model.training
    model.eval()
    device = test_set.images.device
    start, end = shard_bounds(len(test_set), rank, world_size)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # correct, count, loss
    for i in range(start, end, batch_size):
        j = min(i + batch_size, end)
        x = normalize(test_set.images[i:j])
        y = test_set.labels[i:j]
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            logits = model(x)
            if tta:  # average with the mirror image: the only flip-invariant view we add
                logits = (logits + model(x.flip(3))) / 2
        logits = logits.float()
        sums[0] += (logits.argmax(1) == y).sum()
        sums[1] += j - i
        sums[2] += F.cross_entropy(logits, y, reduction="sum")
    all_reduce_sum(sums)
    model.train(was_training)
    correct, total, loss_sum = sums.tolist()
    return EvalResult(int(correct), int(total), loss_sum)


def target_reached(accuracies: Sequence[float], target: float, patience: int) -> bool:
    """The last `patience` evaluations were all at or above the target accuracy."""
    recent = accuracies[-patience:]
    return len(recent) == patience and all(a >= target for a in recent)
