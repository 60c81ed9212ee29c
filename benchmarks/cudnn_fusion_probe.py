"""Checks and times the cuDNN-frontend kernels of the fused blocks (ddp_train.fast.cudnn_blocks) against
the reference ops, eager and compiled, on every fused convolution of the trainer's default model.

    python benchmarks/cudnn_fusion_probe.py                  # CUDA: every shape at the GPU default batch
    python benchmarks/cudnn_fusion_probe.py --shapes 2 --batch 256 --json probe.json

One row per distinct convolution (input channels, output channels, size, with or without the
bn1+ReLU prologue) of WideResNet(width_scale, FusedBasicBlock) at ddp_train.config's defaults, in
bf16 channels_last as the trainer runs it: the cuDNN recipe each step got, the relative error of
each output against the reference (PASS within bf16 tolerances), and the median milliseconds of
forward and backward for cuDNN, the reference eager and the reference under torch.compile (default
mode). A failing stage is that row's error, never the end of the run. Made to finish in about 90 s
on one H100 (--budget-s skips what is left after it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from ddp_train.config import GPU_BATCH_PER_RANK, TrainConfig
from ddp_train.fast.fused_blocks import (CHANNELS, FusedBasicBlock, reference_conv_stats,
                                    reference_conv_stats_backward)
from ddp_train.recipe.model import WideResNet


@dataclass(frozen=True)
class ConvShape:
    """One fused convolution: conv1 of a block (no prologue) or conv2 (bn1 and ReLU before it)."""
    batch: int
    cin: int
    cout: int
    size: int  # height = width
    kernel: int
    padding: int
    prologue: bool

    def label(self) -> str:
        return (f"{self.cin}->{self.cout} {self.size}x{self.size} k{self.kernel}"
                f"{' +sbr' if self.prologue else ''}")


def conv_shapes(model: nn.Module, batch: int, image_size: int = 32) -> list[ConvShape]:
    """The distinct fused convolutions of a WideResNet, in forward order, from its structure: the
    stem keeps the image size, each MaxPool2d halves it (model.WideResNet)."""
    size, shapes = image_size, []
    for layer in model.stages:
        if isinstance(layer, nn.MaxPool2d):
            size //= 2
        elif isinstance(layer, FusedBasicBlock):
            for conv, prologue in ((layer.conv1, False), (layer.conv2, True)):
                shape = ConvShape(batch, conv.in_channels, conv.out_channels, size, conv.kernel_size[0],
                                  conv.padding[0], prologue)
                if shape not in shapes:
                    shapes.append(shape)
    return shapes


def default_model() -> nn.Module:
    """The trainer's default width with fused blocks, on the meta device (no memory, no compute);
    dropout 0, the only one a fused block takes."""
    with torch.device("meta"):
        return WideResNet(100, TrainConfig().width_scale, 0.0, block=FusedBasicBlock)


# bf16 has an 8-bit mantissa (relative step 2^-8 = 0.4%); a convolution's or a reduction's
# summation order moves results by a few of those steps.
TOLERANCE = {"y": 2e-2, "sum": 1e-2, "sq_sum": 2e-2, "grad_x": 3e-2, "grad_w": 3e-2,
             "grad_scale": 3e-2, "grad_bias": 3e-2}


def relative_error(actual: torch.Tensor, expected: torch.Tensor, magnitude: Optional[torch.Tensor] = None) -> float:
    """max |actual - expected| over the largest |expected| (or over `magnitude`, the size of what a
    per-channel sum added up, where cancellation makes the sum itself small)."""
    scale = (magnitude if magnitude is not None else expected).double().abs().max().item()
    return (actual.double() - expected.double()).abs().max().item() / max(scale, 1e-30)


def cuda_ms(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of fn on the GPU, by CUDA events around each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


@dataclass
class Row:
    shape: str
    recipes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    ms: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # stage -> its first error line

    def passed(self) -> bool:
        return (not self.failures and set(TOLERANCE) - ({"grad_scale", "grad_bias"} if "+sbr" not in self.shape
                                                         else set()) <= set(self.errors)
                and all(self.errors[k] <= TOLERANCE[k] for k in self.errors))


def stage(row: Row, name: str, fn: Callable[[], Any]) -> Any:
    """fn's result, or None with its first error line in the row."""
    try:
        return fn()
    except Exception as exc:
        traceback.print_exc()
        text = str(exc).strip()
        row.failures[name] = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        return None


def inputs(shape: ConvShape) -> dict[str, Any]:
    device, layout = torch.device("cuda"), dict(memory_format=torch.channels_last)
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=g, device=device) * scale).to(torch.bfloat16)
    x = randn(shape.batch, shape.cin, shape.size, shape.size).contiguous(**layout)
    w = randn(shape.cout, shape.cin, shape.kernel, shape.kernel,
              scale=(2 / (shape.cin * shape.kernel ** 2)) ** 0.5).contiguous(**layout)  # kaiming, as the model
    scale = (torch.rand(shape.cin, generator=g, device=device) + 0.5).to(torch.bfloat16) if shape.prologue else None
    bias = randn(shape.cin, scale=0.5) if shape.prologue else None
    return dict(x=x, w=w, scale=scale, bias=bias, padding=shape.padding)


def probe(shape: ConvShape, cudnn_blocks: Any, available: bool, repeats: int, compiled: bool) -> Row:
    row = Row(shape.label())
    a = stage(row, "inputs", lambda: inputs(shape))
    if a is None:
        return row
    args = (a["x"], a["w"], a["scale"], a["bias"], a["padding"])
    ref = stage(row, "reference forward", lambda: reference_conv_stats(*args))
    if ref is None:
        return row
    y = ref[0]
    g = torch.Generator(device="cuda").manual_seed(1)
    grads = (torch.randn(y.shape, generator=g, device="cuda").to(y.dtype).contiguous(memory_format=torch.channels_last),
             torch.randn(y.shape[1], generator=g, device="cuda") * 1e-3,
             torch.randn(y.shape[1], generator=g, device="cuda") * 1e-4)
    back_args = (*grads, a["x"], a["w"], a["scale"], a["bias"], y, a["padding"])
    ref_back = stage(row, "reference backward", lambda: reference_conv_stats_backward(*back_args))
    if available:
        out = stage(row, "cudnn forward", lambda: cudnn_blocks.conv_stats_forward(*args))
        if out is not None and ref is not None:
            wide = ref[0].float()
            row.errors.update(y=relative_error(out[0], ref[0]),
                              sum=relative_error(out[1], ref[1], wide.abs().sum(CHANNELS)),
                              sq_sum=relative_error(out[2], ref[2]))
        back = stage(row, "cudnn backward", lambda: cudnn_blocks.conv_stats_backward(*back_args))
        if back is not None and ref_back is not None:
            row.errors.update(grad_x=relative_error(back[0], ref_back[0]),
                              grad_w=relative_error(back[1], ref_back[1]))
            if shape.prologue:
                row.errors.update(grad_scale=relative_error(back[2], ref_back[2]),
                                  grad_bias=relative_error(back[3], ref_back[3]))
        row.recipes = recipes_for(cudnn_blocks, shape)
        stage(row, "time cudnn forward", lambda: row.ms.__setitem__(
            "fwd cudnn", cuda_ms(lambda: cudnn_blocks.conv_stats_forward(*args), repeats)))
        stage(row, "time cudnn backward", lambda: row.ms.__setitem__(
            "bwd cudnn", cuda_ms(lambda: cudnn_blocks.conv_stats_backward(*back_args), repeats)))
    stage(row, "time eager forward", lambda: row.ms.__setitem__(
        "fwd eager", cuda_ms(lambda: reference_conv_stats(*args), repeats)))
    stage(row, "time eager backward", lambda: row.ms.__setitem__(
        "bwd eager", cuda_ms(lambda: reference_conv_stats_backward(*back_args), repeats)))
    if compiled:
        forward, backward = torch.compile(reference_conv_stats), torch.compile(reference_conv_stats_backward)
        stage(row, "time compiled forward", lambda: row.ms.__setitem__(
            "fwd compiled", cuda_ms(lambda: forward(*args), repeats)))
        stage(row, "time compiled backward", lambda: row.ms.__setitem__(
            "bwd compiled", cuda_ms(lambda: backward(*back_args), repeats)))
    return row


def recipes_for(cudnn_blocks: Any, shape: ConvShape) -> dict[str, str]:
    """The recipe (or "reference") each step of this shape got, from the graph cache."""
    found = {}
    for key, entry in cudnn_blocks.GRAPHS.items():
        layouts = dict(key.layouts)
        if (layouts["x"][0] == (shape.batch, shape.cin, shape.size, shape.size) and layouts["w"][0][0] == shape.cout
                and key.has_prologue == shape.prologue):
            found[key.kind] = entry.recipe.name if isinstance(entry, cudnn_blocks.Built) else "reference"
    return found


def table(rows: list[Row]) -> str:
    head = (f"{'shape':<24} {'fwd / dgrad / wgrad recipe':<58} {'max rel err':>11} {'':4} "
            f"{'fwd ms cudnn/eager/compiled':>28} {'bwd ms cudnn/eager/compiled':>28}")
    lines = [head]
    for r in rows:
        recipes = " / ".join(r.recipes.get(k, "-") for k in ("fprop", "dgrad", "wgrad"))
        worst = max(r.errors.values()) if r.errors else float("nan")

        def ms(prefix: str) -> str:
            return "/".join(f"{r.ms[f'{prefix} {k}']:.3f}" if f"{prefix} {k}" in r.ms else "-"
                            for k in ("cudnn", "eager", "compiled"))
        lines.append(f"{r.shape:<24} {recipes:<58} {worst:>11.2e} {'PASS' if r.passed() else 'FAIL':4} "
                     f"{ms('fwd'):>28} {ms('bwd'):>28}")
        for name, text in r.failures.items():
            lines.append(f"    {name}: {text}")
        errors = ", ".join(f"{k} {v:.1e}" for k, v in r.errors.items() if v > TOLERANCE[k])
        if errors:
            lines.append(f"    over tolerance: {errors}")
    return "\n".join(lines)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=GPU_BATCH_PER_RANK,
                   help=f"images per convolution (default: {GPU_BATCH_PER_RANK}, the trainer's per-GPU batch)")
    p.add_argument("--shapes", type=int, help="only the first N distinct shapes")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (median)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile timings")
    p.add_argument("--budget-s", type=float, default=80.0, help="skip the shapes left after this many seconds")
    args = p.parse_args(argv)
    if args.batch < 1 or (args.shapes is not None and args.shapes < 1) or args.repeats < 1:
        p.error("--batch, --shapes and --repeats must be positive")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("cudnn_fusion_probe: no CUDA GPU is visible; run it on a GPU node", file=sys.stderr)
        return 2
    started = time.perf_counter()
    from ddp_train.fast import cudnn_blocks
    reason = cudnn_blocks.unavailable_reason()
    if reason:
        print(f"cudnn frontend: unavailable: {reason}")
    else:
        import cudnn
        print(f"cudnn frontend {cudnn.__version__}, cudnn.backend_version() {cudnn.backend_version()}")
    print(f"torch {torch.__version__}, torch.backends.cudnn.version() {torch.backends.cudnn.version()}, "
          f"GPU {torch.cuda.get_device_name()}")
    with open("/proc/self/maps") as maps:
        print(f"libcudnn mapped: {', '.join(cudnn_blocks.libcudnn_files(maps.read())) or 'none'}")
    # Every shape is a new compile of the same two functions: past the default limit (8) dynamo
    # would run the rest eagerly. torch/_dynamo/config.py: recompile_limit (cache_size_limit before).
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    shapes = conv_shapes(default_model(), args.batch)[:args.shapes]
    rows = []
    for shape in shapes:
        if time.perf_counter() - started > args.budget_s:
            row = Row(shape.label(), failures={"skipped": f"over the {args.budget_s:g} s budget"})
        else:
            row = probe(shape, cudnn_blocks, not reason, args.repeats, not args.no_compile)
        rows.append(row)
        print(f"  {row.shape}: done at {time.perf_counter() - started:.0f} s", flush=True)
        torch.cuda.empty_cache()
    print(table(rows))
    for line in cudnn_blocks.decisions() if not reason else []:
        print(f"  graph: {line}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"passed": r.passed()} for r in rows], indent=1))
    passed = sum(r.passed() for r in rows)
    print(f"cudnn_fusion_probe: {passed}/{len(rows)} shapes PASS"
          f"{'' if not reason else ' (cuDNN kernels unavailable: ' + reason + ')'}, "
          f"{time.perf_counter() - started:.0f} s")
    return 0 if passed == len(rows) and not reason else 1


if __name__ == "__main__":
    sys.exit(main())
