"""The weights' exponential moving average (--ema-decay > 0): updated after every step,
evaluated and checkpointed beside the model.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.nn as nn


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
