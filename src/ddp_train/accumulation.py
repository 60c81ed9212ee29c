"""Gradient accumulation: a rank's batch as N micro-batches, one all-reduce per optimizer step.

--grad-accum-steps N keeps --batch-size the global batch of one optimizer step (so the LR rule,
the step count and the schedule do not change) and runs each rank's share in N forward/backward
passes of batch/(world*N) images, for when that share does not fit in GPU memory.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def gradient_sync(ddp: nn.Module, last: bool) -> ContextManager[object]:
    """DDP's no_sync() for every micro-batch but the last: gradients then add up locally and the
    last backward all-reduces the sum once (DistributedDataParallel.no_sync, "gradients will be
    accumulated on module variables, which will later be synchronized in the first forward-backward
    pass exiting the context";
    https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html).
    A model DDP does not wrap (a world of one) has nothing to hold back."""
    if last or not isinstance(ddp, DistributedDataParallel):
        return contextlib.nullcontext()
    return ddp.no_sync()


def accumulate_gradients(x: torch.Tensor, y: torch.Tensor, steps: int, ddp: nn.Module,
                         loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         backward: Callable[[torch.Tensor], None]) -> torch.Tensor:
    """Forward and backward over `steps` equal micro-batches of (x, y); returns the batch's loss.

    Each micro-batch's mean loss is divided by `steps`, so the summed gradients are those of the
    whole batch's mean loss (equal micro-batches: the caller checks the batch divides). With
    BatchNorm in training mode each micro-batch is normalised by its own statistics, so the
    gradients are those of a smaller batch's normalisation, as on a smaller GPU; everything
    else is the same sum.
    """
    total = torch.zeros((), device=x.device)
    for index, (xs, ys) in enumerate(zip(x.chunk(steps), y.chunk(steps))):
        with gradient_sync(ddp, last=index == steps - 1):
            loss = loss_of(xs, ys) / steps
            backward(loss)
        total += loss.detach()
    return total
