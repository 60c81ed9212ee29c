"""BatchNorm2d with its ReLU and residual add, in training, as a custom op over our own Triton kernels
(ddp_train/fast/bn_kernels.py) and its backward as another; TritonBasicBlock is the residual block on them.
`--bn-kernels triton` builds the model from it; a default nowhere until a GPU figure says it wins.

    ddp_train::bn_act(x, weight, bias, residual?, relu, eps) -> y, mean, var, invstd
        y = relu(batch_norm(x) + residual), the batch's statistics fp32 (var biased)
    ddp_train::bn_act_backward(grad_y, y, x, weight, mean, invstd, has_residual, relu)
        -> grad_x, grad_weight, grad_bias, grad_residual (empty without a residual)

torch.library.custom_op with register_fake and register_autograd, as fused_blocks.py: torch.compile
and DDP see one op per pass, and inductor keeps its own kernels for everything around them. Not
torch.library.triton_op: its fake implementation is the op's own function (torch/_library/triton.py,
`result.register_fake(fn)`), which under Triton's interpreter would run the kernels on fake tensors,
so no compiled graph could be checked on CPU; under CUDA graphs (the CUDA default) a replay skips
the Python of either. The running statistics are updated in torch on per-channel vectors, as
nn.BatchNorm2d does (momentum, unbiased variance). The kernels are imported when an op first
runs: this module imports without triton.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from ddp_train.errors import Seen, TrainError
from ddp_train.recipe.model import BasicBlock


@torch.library.custom_op("ddp_train::bn_act", mutates_args=())
def bn_act(x: Tensor, weight: Tensor, bias: Tensor, residual: Optional[Tensor], relu: bool, eps: float
           ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from ddp_train.fast import bn_kernels
    return bn_kernels.forward(bn_kernels.channels_last(x), weight, bias, residual, relu, eps)


@bn_act.register_fake
def _bn_act_fake(x, weight, bias, residual, relu, eps):
    channels = x.shape[1]
    return (torch.empty_like(x, memory_format=torch.channels_last),
            *(x.new_empty(channels, dtype=torch.float32) for _ in range(3)))


@torch.library.custom_op("ddp_train::bn_act_backward", mutates_args=())
def bn_act_backward(grad_y: Tensor, y: Tensor, x: Tensor, weight: Tensor, mean: Tensor, invstd: Tensor,
                    has_residual: bool, relu: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from ddp_train.fast import bn_kernels
    return bn_kernels.backward(grad_y, y, bn_kernels.channels_last(x), weight, mean, invstd, has_residual, relu)


@bn_act_backward.register_fake
def _bn_act_backward_fake(grad_y, y, x, weight, mean, invstd, has_residual, relu):
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    grad_residual = torch.empty_like(x, memory_format=torch.channels_last) if has_residual else x.new_empty(0)
    return grad_x, torch.empty_like(weight), torch.empty_like(weight), grad_residual


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _bias, residual, relu, _eps = inputs
    y, mean, var, invstd = output
    ctx.save_for_backward(x, weight, y if relu else None, mean, invstd)
    ctx.has_residual, ctx.relu = residual is not None, relu
    ctx.mark_non_differentiable(mean, var, invstd)  # read for the running statistics only


def _backward(ctx, grad_y, _grad_mean, _grad_var, _grad_invstd):
    x, weight, y, mean, invstd = ctx.saved_tensors
    grad_x, grad_weight, grad_bias, grad_residual = bn_act_backward(
        grad_y, y if y is not None else x, x, weight, mean, invstd, ctx.has_residual, ctx.relu)
    return grad_x, grad_weight, grad_bias, grad_residual if ctx.has_residual else None, None, None


bn_act.register_autograd(_backward, setup_context=_setup_context)


def batch_norm_act(x: Tensor, bn: nn.BatchNorm2d, residual: Optional[Tensor] = None, relu: bool = True) -> Tensor:
    """act(bn(x) + residual) as nn.BatchNorm2d computes it in training, its running statistics
    updated alike; x and the residual in the activations' dtype (custom ops are not autocast's)."""
    if bn.weight is None or bn.bias is None or bn.momentum is None:
        raise ValueError("the Triton BatchNorm needs an affine BatchNorm2d with a momentum")
    if residual is not None:
        residual = residual.to(x.dtype)
    y, mean, var, _ = bn_act(x, bn.weight, bn.bias, residual, relu, bn.eps)
    if bn.track_running_stats and bn.running_mean is not None and bn.running_var is not None:
        count = x.numel() // x.shape[1]
        with torch.no_grad():
            bn.running_mean.lerp_(mean, bn.momentum)
            bn.running_var.lerp_(var * (count / (count - 1)), bn.momentum)
            if bn.num_batches_tracked is not None:
                bn.num_batches_tracked.add_(1)
    return y


class TritonBasicBlock(BasicBlock):
    """BasicBlock's parameters, buffers and state dict; in training its two BatchNorms (the first with
    its ReLU, the second with the residual add and the ReLU) run on the Triton kernels. Evaluation
    runs BasicBlock's forward (running statistics)."""

    def __init__(self, cin: int, cout: int, dropout: float):
        super().__init__(cin, cout, dropout)
        for bn in (self.bn1, self.bn2):
            if bn.momentum is None:
                raise ValueError("the Triton BatchNorm needs a momentum (not the cumulative average)")

    def forward(self, x: Tensor) -> Tensor:
        if not self.training:
            return super().forward(x)
        out = self.dropout(batch_norm_act(self.conv1(x), self.bn1))
        return batch_norm_act(self.conv2(out), self.bn2, residual=self.shortcut(x))


def block_for(bn_kernels: str) -> type[BasicBlock]:
    """The residual block for a resolved --bn-kernels (levers.resolve_bn_kernels)."""
    if bn_kernels != "triton":
        return BasicBlock
    try:
        import triton  # noqa: F401  (torch's CUDA wheels install it)
    except ImportError as exc:
        raise TrainError(f"--bn-kernels triton: the triton package is not importable ({exc}); torch's CUDA "
                         f"wheels install it (pip install triton), or use --bn-kernels torch",
                         Seen.BY_EVERY_RANK_OF_NODE) from None
    return TritonBasicBlock
