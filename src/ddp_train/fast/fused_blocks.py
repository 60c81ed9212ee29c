"""The residual block with BatchNorm statistics made by its convolutions, through two custom ops
that torch.compile and DDP each see as one op: the seam for cuDNN's fused Hopper kernels.

    conv_stats(x, w, scale?, bias?, padding) -> y, sum, sq_sum
        a = relu(x * scale + bias) (x itself without scale), y = conv2d(a, w, padding), and y's
        per-channel sum and sum of squares in fp32 (fp64 for fp64): the semantics of cudnn-frontend's
        samples/python/test_conv_genstats.py (scale, bias, relu, conv_fprop, genstats).
    conv_stats_backward(grad_y, grad_sum, grad_sq_sum, x, w, scale?, bias?, y, padding)
        -> grad_x, grad_w, grad_scale, grad_bias: the data gradient with the ReLU and BatchNorm
        backward and the weight gradient (cudnn-frontend's samples/cpp/convolution/dgrads.cpp,
        "Dgrad Drelu DBNweight", and wgrads.cpp).

The BatchNorm finalize (statistics to scale and bias, the running statistics) stays plain torch
on C-sized vectors. Every device runs the reference implementation, the plain PyTorch
composition, unless a device's kernels are plugged in (`plug_in`). The cuDNN-frontend kernels
(ddp_train.fast.cudnn_blocks) are plugged in only by its `use_cudnn_kernels()`, which nothing calls
by default: they are not yet checked on a GPU (benchmarks/cudnn_fusion_probe.py checks them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ddp_train.recipe.model import BasicBlock

CHANNELS = (0, 2, 3)  # N, H, W: the dimensions BatchNorm2d reduces over


@dataclass(frozen=True)
class Kernels:
    """A device's implementations of both ops: the reference functions' signatures, and outputs
    of the same shapes, dtypes and strides (torch.compile plans with the fake versions, which are
    the reference run on fake tensors)."""
    forward: Callable[..., tuple[Tensor, Tensor, Tensor]]
    backward: Callable[..., tuple[Tensor, Tensor, Tensor, Tensor]]
    source: str  # what implements them, for a run's record


# Plugged-in kernels by device type ("cuda": a cuDNN-frontend implementation, once one is
# written and measured). A device not here runs the reference.
KERNELS: dict[str, Kernels] = {}


def plug_in(device_type: str, kernels: Kernels) -> None:
    KERNELS[device_type] = kernels


def unplug(device_type: str) -> None:
    """Back to the reference on that device."""
    KERNELS.pop(device_type, None)


def _prologue(x: Tensor, scale: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    if scale is None or bias is None:
        return x
    return torch.relu(x * scale.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1))


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 statistics, as cuDNN's genstats makes them; fp64 for an fp64 model (the CPU tests')."""
    return torch.promote_types(dtype, torch.float32)


def reference_conv_stats(x: Tensor, weight: Tensor, scale: Optional[Tensor], bias: Optional[Tensor],
                         padding: int) -> tuple[Tensor, Tensor, Tensor]:
    y = F.conv2d(_prologue(x, scale, bias), weight, padding=padding)
    wide = y.to(stats_dtype(y.dtype))
    return y, wide.sum(CHANNELS), wide.square().sum(CHANNELS)


def reference_conv_stats_backward(grad_y: Tensor, grad_sum: Tensor, grad_sq_sum: Tensor, x: Tensor, weight: Tensor,
                                  scale: Optional[Tensor], bias: Optional[Tensor], y: Tensor, padding: int
                                  ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    # d(sum)/dy = 1 and d(sq_sum)/dy = 2y, per channel, added to the gradient that reaches y.
    channel, wide = (1, -1, 1, 1), stats_dtype(y.dtype)
    grad = (grad_y.to(wide) + grad_sum.view(channel) + 2 * y.to(wide) * grad_sq_sum.view(channel)).to(y.dtype)
    a = _prologue(x, scale, bias)
    grad_a, grad_w, _ = torch.ops.aten.convolution_backward(
        grad, a, weight, None, [1, 1], [padding, padding], [1, 1], False, [0, 0], 1, [True, True, False])
    if scale is None or bias is None:
        return grad_a, grad_w, x.new_empty(0), x.new_empty(0)
    grad_pre = torch.where(a > 0, grad_a, torch.zeros_like(grad_a))  # ReLU's backward, as threshold_backward
    grad_scale = (grad_pre.to(wide) * x.to(wide)).sum(CHANNELS).to(scale.dtype)
    grad_bias = grad_pre.to(wide).sum(CHANNELS).to(bias.dtype)
    return grad_pre * scale.view(channel), grad_w, grad_scale, grad_bias


@torch.library.custom_op("ddp_train::conv_stats", mutates_args=())
def conv_stats(x: Tensor, weight: Tensor, scale: Optional[Tensor], bias: Optional[Tensor], padding: int
               ) -> tuple[Tensor, Tensor, Tensor]:
    kernels = KERNELS.get(x.device.type)
    return (kernels.forward if kernels else reference_conv_stats)(x, weight, scale, bias, padding)


@torch.library.custom_op("ddp_train::conv_stats_backward", mutates_args=())
def conv_stats_backward(grad_y: Tensor, grad_sum: Tensor, grad_sq_sum: Tensor, x: Tensor, weight: Tensor,
                        scale: Optional[Tensor], bias: Optional[Tensor], y: Tensor, padding: int
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    kernels = KERNELS.get(x.device.type)
    return (kernels.backward if kernels else reference_conv_stats_backward)(
        grad_y, grad_sum, grad_sq_sum, x, weight, scale, bias, y, padding)


# The fake (shape-only) versions run the reference on fake tensors: same shapes, dtypes and strides.
conv_stats.register_fake(reference_conv_stats)
conv_stats_backward.register_fake(reference_conv_stats_backward)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, scale, bias, padding = inputs
    ctx.save_for_backward(x, weight, scale, bias, output[0])
    ctx.padding = padding


def _backward(ctx, grad_y, grad_sum, grad_sq_sum):
    x, weight, scale, bias, y = ctx.saved_tensors
    grad_x, grad_w, grad_scale, grad_bias = conv_stats_backward(
        grad_y, grad_sum, grad_sq_sum, x, weight, scale, bias, y, ctx.padding)
    if scale is None:
        return grad_x, grad_w, None, None, None
    return grad_x, grad_w, grad_scale, grad_bias, None


conv_stats.register_autograd(_backward, setup_context=_setup_context)


def bn_finalize(bn: nn.BatchNorm2d, total: Tensor, sq_total: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """Scale and bias that normalise with the batch's statistics, as BatchNorm2d in training does,
    and its running statistics updated the same way (unbiased variance, momentum)."""
    mean = total / count
    var = (sq_total / count - mean.square()).clamp_min(0)
    scale = bn.weight * torch.rsqrt(var + bn.eps)
    if bn.track_running_stats and bn.running_mean is not None and bn.running_var is not None:
        with torch.no_grad():
            bn.running_mean.lerp_(mean, bn.momentum)
            bn.running_var.lerp_(var * count / max(1, count - 1), bn.momentum)
            bn.num_batches_tracked.add_(1)
    return scale, bn.bias - mean * scale


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype autocast would run a convolution in here: custom ops are not autocast's."""
    device_type = x.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype


class FusedBasicBlock(BasicBlock):
    """BasicBlock's parameters, buffers and state dict; in training, its two convolutions make
    their BatchNorm statistics (conv_stats) and the second takes bn1 and ReLU as its prologue.
    Evaluation runs BasicBlock's forward (running statistics)."""

    def __init__(self, cin: int, cout: int, dropout: float):
        if dropout > 0:
            raise ValueError(f"a fused block has no dropout between its first BatchNorm and its second "
                             f"convolution, and dropout is {dropout}: use dropout 0 (the improved recipe's)")
        super().__init__(cin, cout, dropout)
        for bn in (self.bn1, self.bn2):
            if bn.momentum is None:
                raise ValueError("a fused block's BatchNorm needs a momentum (not the cumulative average)")

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        dtype = compute_dtype(x)
        y1, sum1, sq_sum1 = conv_stats(x.to(dtype), self.conv1.weight.to(dtype), None, None, 1)
        scale1, bias1 = bn_finalize(self.bn1, sum1, sq_sum1, y1.numel() // y1.shape[1])
        y2, sum2, sq_sum2 = conv_stats(y1, self.conv2.weight.to(dtype), scale1.to(dtype), bias1.to(dtype), 1)
        scale2, bias2 = bn_finalize(self.bn2, sum2, sq_sum2, y2.numel() // y2.shape[1])
        wide = y2.to(stats_dtype(y2.dtype))
        out = (wide * scale2.view(1, -1, 1, 1) + bias2.view(1, -1, 1, 1)).to(y2.dtype)
        return self.relu(out + self.shortcut(x))
