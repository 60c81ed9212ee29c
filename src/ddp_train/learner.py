"""The model and what trains it (SGD, the fp16 grad scaler, the loss, an EMA of the weights),
built alike on every rank; a checkpoint saves and restores it (checkpoint.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from ddp_train import distributed
from ddp_train.config import TrainConfig, peak_lr
from ddp_train.data import memory_format_for
from ddp_train.distributed import DistEnv
from ddp_train.ema import copy_buffers, make_ema
from ddp_train.layout import NUM_CLASSES
from ddp_train.model import WideResNet

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Learner:
    model: nn.Module
    ema: Optional[nn.Module]  # None without --ema-decay
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler  # enabled for fp16 only
    criterion: nn.Module
    autocast_dtype: Optional[torch.dtype]  # None: fp32, no autocast
    lr_peak: float

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


def build_learner(config: TrainConfig, dist_env: DistEnv, device: torch.device, precision: str) -> Learner:
    torch.manual_seed(config.seed)  # identical initial weights on every rank
    model = WideResNet(NUM_CLASSES, config.width_scale, config.dropout)
    model = model.to(device, memory_format=memory_format_for(device))
    ema = make_ema(model, config.ema_decay)
    lr_peak = peak_lr(config, dist_env.world_size)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=lr_peak, momentum=config.momentum, nesterov=config.nesterov,
        weight_decay=config.weight_decay, fused=device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    criterion = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    torch.manual_seed(config.seed * 1_000_003 + dist_env.rank + 1)  # per-rank dropout masks
    return Learner(model, ema, optimizer, scaler, criterion, AUTOCAST_DTYPES[precision], lr_peak)
