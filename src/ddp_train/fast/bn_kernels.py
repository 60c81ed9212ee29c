"""Channels-last BatchNorm2d in training, with its ReLU and residual add, as Triton kernels of our own:
one pass over the activations for the statistics, one for the output, two for the backward.

A channels_last [N, C, H, W] tensor is a row-major [M, C] matrix, M = N*H*W: each row holds one
pixel's C channels side by side. Every kernel walks tiles of [block_m rows, block_c channels]
(`plan`), so a channel's per-channel values load once per tile, not once per element.

    forward   stats       reads x; per program, the mean and M2 (sum of squared deviations) of its
                          rows, tile by tile, combined with Chan et al.'s parallel formula
              finalize    the programs' partials into the batch's mean, variance and 1/sqrt(var+eps)
                          (Chan's formula again: M2 = sum M2_p + n_p (mean_p - mean)^2), per channel
              apply       y = act((x - mean) * w * invstd + b [+ residual]): reads x [and the
                          residual], writes y
    backward  grad stats  g = grad_y where y > 0 (ReLU's backward, read off the output as torch's
                          threshold_backward does), written out as the residual's gradient when there
                          is a residual; per-channel sums of g and g * xhat, xhat = (x - mean) * invstd
              finalize    those sums: the bias and weight gradients, and the input gradient's terms
              input       grad_x = w * invstd * (g - sum(g) / M - xhat * sum(g * xhat) / M)

Statistics and all arithmetic are fp32; activations and their gradients keep their dtype (bf16, fp16
or fp32). Bytes over the activations per call, A = M * C * itemsize: stats A; apply 2A (+A with a
residual); grad stats 2A (+A with a ReLU, +A written with a residual); input 2A (+A for the ReLU's
mask when there is no residual to read g from).

On CUDA tensors Triton compiles the kernels. CPU tensors run them in Triton's interpreter, which
TRITON_INTERPRET=1 turns on before triton is imported (triton/runtime/jit.py picks the interpreter
in `jit`, at decoration): the same kernel source, for tests. No autotuning: the tile shapes are
fixed (`plan`), so a run's setup compiles each kernel once per dtype and flag set.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

# Launch shape, fixed rather than autotuned (setup); benchmarks/bn_bandwidth.py --tile, --warps and
# --programs try others on a GPU without editing these.
TILE = 4096  # elements per tile: 32 fp32 values per thread at 4 warps
NUM_WARPS = 4
MAX_BLOCK_C = 64  # 128 bytes of a bf16 row per load
TARGET_PROGRAMS = 1024  # reduction programs per call: several per multiprocessor (132 on an H100)
FINAL_BLOCK_C = 64
FINAL_BLOCK_P = 32
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
RUNTIME_INTS = ["rows", "channels", "rows_per_program", "partials"]  # not specialised: one compile per shape set


@dataclass(frozen=True)
class Plan:
    """How a call tiles the [rows, channels] matrix: tiles of block_m x block_c; each reduction
    program takes rows_per_program rows (a whole number of tiles) of one column block."""
    rows: int
    channels: int
    block_m: int
    block_c: int
    rows_per_program: int

    @property
    def column_blocks(self) -> int:
        return triton.cdiv(self.channels, self.block_c)

    @property
    def row_tiles(self) -> int:
        return triton.cdiv(self.rows, self.block_m)

    @property
    def partials(self) -> int:
        """Reduction programs per column block, each writing one partial per channel."""
        return triton.cdiv(self.rows, self.rows_per_program)


def plan(rows: int, channels: int, target_programs: Optional[int] = None) -> Plan:
    """Tiles of TILE elements for a [rows, channels] matrix. block_c divides the channels where a power
    of two of 16 or more does (160 -> 32, 320 and 640 -> 64: no idle lanes); else it covers them,
    masked. About target_programs (default TARGET_PROGRAMS) reduction programs share the rows."""
    dividing = [b for b in (MAX_BLOCK_C, 32, 16) if channels % b == 0]
    block_c = dividing[0] if dividing else min(MAX_BLOCK_C, triton.next_power_of_2(channels))
    block_m = max(1, TILE // block_c)
    per_column = max(1, (target_programs or TARGET_PROGRAMS) // triton.cdiv(channels, block_c))
    tiles_per_program = triton.cdiv(triton.cdiv(rows, block_m), per_column)
    return Plan(rows, channels, block_m, block_c, tiles_per_program * block_m)


# --- the kernels ----------------------------------------------------------------------------------

def _stats_partials(x_ptr, mean_ptr, m2_ptr, rows, channels, rows_per_program,
                    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    first = tl.program_id(0).to(tl.int64) * rows_per_program
    count = tl.full([BLOCK_C], 0.0, tl.float32)
    mean = tl.full([BLOCK_C], 0.0, tl.float32)
    m2 = tl.full([BLOCK_C], 0.0, tl.float32)
    for start in range(0, rows_per_program, BLOCK_M):
        row = first + start + tl.arange(0, BLOCK_M)
        row_mask = row < rows
        mask = row_mask[:, None] & col_mask[None, :]
        v = tl.load(x_ptr + row[:, None] * channels + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        n = tl.sum(row_mask.to(tl.float32), axis=0)
        tile_mean = tl.sum(v, axis=0) / tl.maximum(n, 1.0)
        d = tl.where(mask, v - tile_mean[None, :], 0.0)
        total = count + n
        delta = tile_mean - mean
        share = n / tl.maximum(total, 1.0)
        mean = mean + delta * share
        m2 = m2 + tl.sum(d * d, axis=0) + delta * delta * count * share
        count = total
    out = tl.program_id(0) * channels + cols
    tl.store(mean_ptr + out, mean, mask=col_mask)
    tl.store(m2_ptr + out, m2, mask=col_mask)


def _stats_finalize(mean_part_ptr, m2_part_ptr, mean_ptr, var_ptr, invstd_ptr, rows, channels, rows_per_program,
                    partials, eps, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    total = tl.full([BLOCK_C], 0.0, tl.float32)
    for start in range(0, partials, BLOCK_P):
        part = start + tl.arange(0, BLOCK_P)
        n = tl.where(part < partials, tl.minimum(rows_per_program, rows - part * rows_per_program), 0).to(tl.float32)
        mask = (part < partials)[:, None] & col_mask[None, :]
        part_mean = tl.load(mean_part_ptr + part[:, None] * channels + cols[None, :], mask=mask, other=0.0)
        total += tl.sum(part_mean * n[:, None], axis=0)
    mean = total / rows
    m2 = tl.full([BLOCK_C], 0.0, tl.float32)
    for start in range(0, partials, BLOCK_P):
        part = start + tl.arange(0, BLOCK_P)
        n = tl.where(part < partials, tl.minimum(rows_per_program, rows - part * rows_per_program), 0).to(tl.float32)
        mask = (part < partials)[:, None] & col_mask[None, :]
        offsets = part[:, None] * channels + cols[None, :]
        part_mean = tl.load(mean_part_ptr + offsets, mask=mask, other=0.0)
        part_m2 = tl.load(m2_part_ptr + offsets, mask=mask, other=0.0)
        d = part_mean - mean[None, :]
        m2 += tl.sum(part_m2 + n[:, None] * d * d, axis=0)
    var = m2 / rows
    tl.store(mean_ptr + cols, mean, mask=col_mask)
    tl.store(var_ptr + cols, var, mask=col_mask)
    tl.store(invstd_ptr + cols, tl.rsqrt(var + eps), mask=col_mask)


def _apply(x_ptr, residual_ptr, y_ptr, mean_ptr, invstd_ptr, weight_ptr, bias_ptr, rows, channels,
           HAS_RESIDUAL: tl.constexpr, RELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = (row < rows)[:, None] & col_mask[None, :]
    offsets = row[:, None] * channels + cols[None, :]
    mean = tl.load(mean_ptr + cols, mask=col_mask, other=0.0)
    scale = tl.load(invstd_ptr + cols, mask=col_mask, other=0.0) * tl.load(weight_ptr + cols, mask=col_mask,
                                                                          other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = (x - mean[None, :]) * scale[None, :] + bias[None, :]
    if HAS_RESIDUAL:
        y += tl.load(residual_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if RELU:
        y = tl.maximum(y, 0.0)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def _grad_partials(grad_y_ptr, y_ptr, x_ptr, g_ptr, mean_ptr, invstd_ptr, sum_g_ptr, sum_gx_ptr, rows, channels,
                   rows_per_program, RELU: tl.constexpr, WRITE_G: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_C: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    mean = tl.load(mean_ptr + cols, mask=col_mask, other=0.0)
    invstd = tl.load(invstd_ptr + cols, mask=col_mask, other=0.0)
    first = tl.program_id(0).to(tl.int64) * rows_per_program
    sum_g = tl.full([BLOCK_C], 0.0, tl.float32)
    sum_gx = tl.full([BLOCK_C], 0.0, tl.float32)
    for start in range(0, rows_per_program, BLOCK_M):
        row = first + start + tl.arange(0, BLOCK_M)
        mask = (row < rows)[:, None] & col_mask[None, :]
        offsets = row[:, None] * channels + cols[None, :]
        g = tl.load(grad_y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if RELU:
            g = tl.where(tl.load(y_ptr + offsets, mask=mask, other=0.0) > 0, g, 0.0)
        if WRITE_G:
            tl.store(g_ptr + offsets, g.to(g_ptr.dtype.element_ty), mask=mask)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        sum_g += tl.sum(g, axis=0)
        sum_gx += tl.sum(g * (x - mean[None, :]) * invstd[None, :], axis=0)
    out = tl.program_id(0) * channels + cols
    tl.store(sum_g_ptr + out, sum_g, mask=col_mask)
    tl.store(sum_gx_ptr + out, sum_gx, mask=col_mask)


def _grad_finalize(sum_g_part_ptr, sum_gx_part_ptr, weight_ptr, invstd_ptr, grad_weight_ptr, grad_bias_ptr,
                   scale_ptr, mean_term_ptr, x_term_ptr, rows, channels, partials,
                   BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    sum_g = tl.full([BLOCK_C], 0.0, tl.float32)
    sum_gx = tl.full([BLOCK_C], 0.0, tl.float32)
    for start in range(0, partials, BLOCK_P):
        part = start + tl.arange(0, BLOCK_P)
        mask = (part < partials)[:, None] & col_mask[None, :]
        offsets = part[:, None] * channels + cols[None, :]
        sum_g += tl.sum(tl.load(sum_g_part_ptr + offsets, mask=mask, other=0.0), axis=0)
        sum_gx += tl.sum(tl.load(sum_gx_part_ptr + offsets, mask=mask, other=0.0), axis=0)
    invstd = tl.load(invstd_ptr + cols, mask=col_mask, other=0.0)
    scale = tl.load(weight_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) * invstd
    tl.store(grad_weight_ptr + cols, sum_gx, mask=col_mask)
    tl.store(grad_bias_ptr + cols, sum_g, mask=col_mask)
    tl.store(scale_ptr + cols, scale, mask=col_mask)
    tl.store(mean_term_ptr + cols, sum_g / rows, mask=col_mask)
    tl.store(x_term_ptr + cols, scale * invstd * sum_gx / rows, mask=col_mask)


def _grad_input(g_ptr, y_ptr, x_ptr, grad_x_ptr, mean_ptr, scale_ptr, mean_term_ptr, x_term_ptr, rows, channels,
                RELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    row = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = (row < rows)[:, None] & col_mask[None, :]
    offsets = row[:, None] * channels + cols[None, :]
    mean = tl.load(mean_ptr + cols, mask=col_mask, other=0.0)
    scale = tl.load(scale_ptr + cols, mask=col_mask, other=0.0)
    mean_term = tl.load(mean_term_ptr + cols, mask=col_mask, other=0.0)
    x_term = tl.load(x_term_ptr + cols, mask=col_mask, other=0.0)
    g = tl.load(g_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    if RELU:
        g = tl.where(tl.load(y_ptr + offsets, mask=mask, other=0.0) > 0, g, 0.0)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    grad_x = scale[None, :] * (g - mean_term[None, :]) - (x - mean[None, :]) * x_term[None, :]
    tl.store(grad_x_ptr + offsets, grad_x.to(grad_x_ptr.dtype.element_ty), mask=mask)


def _jit(fn):
    """triton.jit with the kernel's own runtime ints unspecialised (an older Triton looks each name up
    in the kernel's arguments)."""
    return triton.jit(fn, do_not_specialize=[name for name in RUNTIME_INTS if name in inspect.signature(fn).parameters])


stats_partials = _jit(_stats_partials)
stats_finalize = _jit(_stats_finalize)
apply = _jit(_apply)
grad_partials = _jit(_grad_partials)
grad_finalize = _jit(_grad_finalize)
grad_input = _jit(_grad_input)


# --- the passes, as torch calls them --------------------------------------------------------------

def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def check_input(x: Tensor) -> tuple[int, int]:
    """(rows, channels) of a 4-D channels_last activation the kernels take; a ValueError otherwise."""
    if x.dim() != 4 or x.dtype not in DTYPES:
        raise ValueError(f"the Triton BatchNorm takes 4-D bf16, fp16 or fp32 activations, not {x.dim()}-D {x.dtype}")
    if x.device.type != "cuda" and not interpreted():
        raise ValueError(f"the Triton BatchNorm runs on CUDA tensors (or on CPU under TRITON_INTERPRET=1, "
                         f"for tests), and this tensor is on {x.device}")
    if not x.is_contiguous(memory_format=torch.channels_last):
        raise ValueError("the Triton BatchNorm takes channels_last activations: .contiguous(memory_format="
                         "torch.channels_last) first")
    n, c, h, w = x.shape
    if n * h * w < 2:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {list(x.shape)}")
    return n * h * w, c


def channels_last(t: Tensor) -> Tensor:
    return t.contiguous(memory_format=torch.channels_last)


@dataclass(frozen=True)
class Stats:
    mean: Tensor  # fp32, per channel
    var: Tensor  # biased, as the normalisation uses it
    invstd: Tensor


def stats(x: Tensor, eps: float, layout: Plan) -> Stats:
    """The batch's per-channel statistics: the stats pass and its finalize."""
    rows, channels = layout.rows, layout.channels
    wide = dict(dtype=torch.float32, device=x.device)
    mean_part = torch.empty(layout.partials, channels, **wide)
    m2_part = torch.empty(layout.partials, channels, **wide)
    stats_partials[(layout.partials, layout.column_blocks)](
        x, mean_part, m2_part, rows, channels, layout.rows_per_program, BLOCK_M=layout.block_m, BLOCK_C=layout.block_c,
        num_warps=NUM_WARPS)
    mean, var, invstd = (torch.empty(channels, **wide) for _ in range(3))
    stats_finalize[(triton.cdiv(channels, FINAL_BLOCK_C),)](
        mean_part, m2_part, mean, var, invstd, rows, channels, layout.rows_per_program, layout.partials, eps,
        BLOCK_P=FINAL_BLOCK_P, BLOCK_C=FINAL_BLOCK_C)
    return Stats(mean, var, invstd)


def normalize(x: Tensor, batch: Stats, weight: Tensor, bias: Tensor, residual: Optional[Tensor], relu: bool,
              layout: Plan) -> Tensor:
    y = torch.empty_like(x, memory_format=torch.channels_last)
    apply[(layout.row_tiles, layout.column_blocks)](
        x, residual if residual is not None else x, y, batch.mean, batch.invstd, weight, bias, layout.rows,
        layout.channels, HAS_RESIDUAL=residual is not None, RELU=relu, BLOCK_M=layout.block_m,
        BLOCK_C=layout.block_c, num_warps=NUM_WARPS)
    return y


def forward(x: Tensor, weight: Tensor, bias: Tensor, residual: Optional[Tensor], relu: bool, eps: float
            ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """y = act(batch_norm(x) [+ residual]) with the batch's statistics; returns y, mean, var (biased)
    and invstd, the last three fp32 per channel."""
    rows, channels = check_input(x)
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"the residual is {list(residual.shape)} {residual.dtype}, x {list(x.shape)} {x.dtype}")
    layout = plan(rows, channels)
    batch = stats(x, eps, layout)
    y = normalize(x, batch, weight.contiguous(), bias.contiguous(),
                  channels_last(residual) if residual is not None else None, relu, layout)
    return y, batch.mean, batch.var, batch.invstd


@dataclass(frozen=True)
class GradTerms:
    grad_weight: Tensor
    grad_bias: Tensor
    scale: Tensor  # w * invstd
    mean_term: Tensor  # sum(g) / M
    x_term: Tensor  # w * invstd^2 * sum(g * xhat) / M
    g: Optional[Tensor]  # grad_y after the ReLU's mask, when written out (the residual's gradient)


def grad_stats(grad_y: Tensor, y: Tensor, x: Tensor, weight: Tensor, mean: Tensor, invstd: Tensor, relu: bool,
               write_g: bool, layout: Plan) -> GradTerms:
    rows, channels = layout.rows, layout.channels
    wide = dict(dtype=torch.float32, device=x.device)
    sum_g_part = torch.empty(layout.partials, channels, **wide)
    sum_gx_part = torch.empty(layout.partials, channels, **wide)
    g = torch.empty_like(x, memory_format=torch.channels_last) if write_g else None
    grad_partials[(layout.partials, layout.column_blocks)](
        grad_y, y, x, g if g is not None else x, mean, invstd, sum_g_part, sum_gx_part, rows, channels,
        layout.rows_per_program, RELU=relu, WRITE_G=write_g, BLOCK_M=layout.block_m, BLOCK_C=layout.block_c,
        num_warps=NUM_WARPS)
    grad_weight, grad_bias, scale, mean_term, x_term = (torch.empty(channels, **wide) for _ in range(5))
    grad_finalize[(triton.cdiv(channels, FINAL_BLOCK_C),)](
        sum_g_part, sum_gx_part, weight, invstd, grad_weight, grad_bias, scale, mean_term, x_term, rows, channels,
        layout.partials, BLOCK_P=FINAL_BLOCK_P, BLOCK_C=FINAL_BLOCK_C)
    return GradTerms(grad_weight, grad_bias, scale, mean_term, x_term, g)


def input_grad(source: Tensor, y: Tensor, x: Tensor, mean: Tensor, terms: GradTerms, relu_mask: bool,
               layout: Plan) -> Tensor:
    """grad_x from `source`: the masked gradient g, or grad_y with relu_mask (then masked here)."""
    grad_x = torch.empty_like(x, memory_format=torch.channels_last)
    grad_input[(layout.row_tiles, layout.column_blocks)](
        source, y, x, grad_x, mean, terms.scale, terms.mean_term, terms.x_term, layout.rows, layout.channels,
        RELU=relu_mask, BLOCK_M=layout.block_m, BLOCK_C=layout.block_c, num_warps=NUM_WARPS)
    return grad_x


def backward(grad_y: Tensor, y: Tensor, x: Tensor, weight: Tensor, mean: Tensor, invstd: Tensor, has_residual: bool,
             relu: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """grad_x, grad_weight, grad_bias and the residual's gradient (empty without a residual) of
    `forward`; y is forward's output (read for the ReLU's mask only)."""
    rows, channels = check_input(x)
    layout = plan(rows, channels)
    grad_y = channels_last(grad_y.to(x.dtype))
    y = channels_last(y) if relu else x
    write_g = has_residual and relu  # without the ReLU the residual's gradient is grad_y itself
    terms = grad_stats(grad_y, y, x, weight.contiguous(), mean, invstd, relu, write_g, layout)
    source = terms.g if terms.g is not None else grad_y
    grad_x = input_grad(source, y, x, mean, terms, relu and not write_g, layout)
    # A custom op's output may not alias its input: without the ReLU, the residual's gradient is a copy.
    grad_residual = (terms.g if terms.g is not None else grad_y.clone()) if has_residual else x.new_empty(0)
    return (grad_x, terms.grad_weight.to(weight.dtype), terms.grad_bias.to(weight.dtype), grad_residual)
