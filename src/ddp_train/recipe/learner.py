"""The recipe's code beside its values: the model and what trains it (SGD, the fp16 grad scaler,
the loss, an EMA of the weights), built alike on every rank, and what the loop does with them each
step: the learning rate, gradient accumulation, the EMA update. Its state (state_dict, load_state_dict)
is what a checkpoint saves and restores (checkpoint.py) and the warm-up puts back (speed.warm_up).

- The learning rate: linear warm-up, then constant, cosine or linear decay to zero (the steps it counts:
  data.plan_steps).
- The weights' exponential moving average (--ema-decay > 0): updated after every step, evaluated
  and checkpointed beside the model.
- Gradient accumulation (--grad-accum-steps N): a rank's batch as N micro-batches, one all-reduce
  per optimizer step. --batch-size stays the global batch of one optimizer step (so the LR rule,
  the step count and the schedule do not change); each rank's share runs in N forward/backward
  passes of batch/(world*N) images, for when that share does not fit in GPU memory.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Mapping, Optional

import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from ddp_train import distributed
from ddp_train.fast.bn_blocks import block_for
from ddp_train.recipe.data import memory_format_for
from ddp_train.recipe.eager_sgd import EagerSGD
from ddp_train.layout import NUM_CLASSES
from ddp_train.fast.loss_scale import LossScaler
from ddp_train.recipe.model import WideResNet

if TYPE_CHECKING:
    from ddp_train.resolve import Decisions

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Learner:
    model: nn.Module
    ema: Optional[nn.Module]  # None without --ema-decay
    optimizer: torch.optim.Optimizer
    scaler: LossScaler  # enabled for fp16 only
    criterion: nn.Module
    autocast_dtype: Optional[torch.dtype]  # None: fp32, no autocast

    def state_dict(self) -> dict[str, Any]:
        """Everything of the learner that a checkpoint keeps and the warm-up puts back, under the
        checkpoint's keys (checkpoint.py adds the progress, the RNG and the config beside them).
        A stateful part added to the learner is added here, to load_state_dict and to state_bytes.
        The tensors are live references, as nn.Module.state_dict's are: clone them to keep them."""
        return {"model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Back to `state` (a state_dict(), or a checkpoint that holds one), in place: DDP, compile and
        CUDA graphs keep their pointers. No gradient is left pending. An EMA the state lacks (a
        checkpoint of a run without --ema-decay) keeps its copy of the weights."""
        with torch.no_grad():
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None and state.get("ema") is not None:
            with torch.no_grad():
                self.ema.load_state_dict(state["ema"])

    def state_bytes(self) -> int:
        """A checkpoint's learner state before one exists: the weights, SGD's momentum buffers (one per
        weight, when momentum is on) and the EMA's copy."""
        copies = 1 + (self.optimizer.defaults.get("momentum", 0) > 0) + (self.ema is not None)
        return estimated_bytes(self.model, copies)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def for_evaluation(self) -> nn.Module:
        """The weights to evaluate, BatchNorm statistics averaged over the ranks first (they drift
        apart per rank) and copied into the EMA."""
        distributed.average_buffers(self.model)
        if self.ema is not None:
            copy_buffers(self.ema, self.model)
        return self.ema or self.model


def build_learner(decided: Decisions, rank: int, device: torch.device) -> Learner:
    """The learner as decided (resolve.py), with the same initial weights on every rank."""
    config, precision = decided.config, decided.precision.name
    torch.manual_seed(config.seed)  # identical initial weights on every rank
    model = WideResNet(NUM_CLASSES, config.width_scale, config.dropout, block=block_for(decided.bn_kernels))
    model = model.to(device, memory_format=memory_format_for(device))
    ema = make_ema(model, config.ema_decay)
    optimizer = EagerSGD(  # torch.optim.SGD without importing torch._dynamo in every rank (eager_sgd.py)
        model.parameters(), lr=decided.lr_peak, momentum=config.momentum, nesterov=config.nesterov,
        weight_decay=config.weight_decay, fused=device.type == "cuda" or precision == "fp16")
    scaler = LossScaler(device, enabled=precision == "fp16")  # skips on the device: needs the fused SGD
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    torch.manual_seed(config.seed * 1_000_003 + rank + 1)  # per-rank dropout masks
    return Learner(model, ema, optimizer, scaler, criterion, AUTOCAST_DTYPES[precision])


def estimated_bytes(model: torch.nn.Module, copies: int) -> int:
    """A checkpoint's size before one exists: the model's state `copies` times (weights,
    momentum buffers, an EMA copy)."""
    return copies * sum(t.numel() * t.element_size() for t in model.state_dict().values())


# -- The learning rate at each step --

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


# -- The weights' exponential moving average --

def make_ema(model: nn.Module, decay: float) -> Optional[nn.Module]:
    return copy.deepcopy(model).requires_grad_(False) if decay > 0 else None


@torch.no_grad()
def update_ema(ema: nn.Module, model: nn.Module, decay: float) -> None:
    ema_params = list(ema.parameters())
    torch._foreach_lerp_(ema_params, list(model.parameters()), 1.0 - decay)
    copy_buffers(ema, model)


@torch.no_grad()
def copy_buffers(dst: nn.Module, src: nn.Module) -> None:
    for d, s in zip(dst.buffers(), src.buffers()):
        d.copy_(s)


# -- Gradient accumulation: one all-reduce per optimizer step --

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
