"""Our Triton BatchNorm kernels (ddp_train/fast/bn_kernels.py) against the bandwidth limit and against
inductor, on the BatchNorms of the trainer's model, in one run on one GPU.

    python benchmarks/bn_bandwidth.py                      # batch 1024 (the trainer's), bf16
    python benchmarks/bn_bandwidth.py --dtype fp16 --json bn.json
    python benchmarks/bn_bandwidth.py --tile 8192 --warps 8 --no-inductor   # another launch shape

Per BatchNorm shape of WideResNet at width 1 (160 channels at 32x32, 320 at 16x16, 640 at 8x8), as
bn1 (+ReLU) and as bn2 (+residual add, +ReLU):

- each pass's achieved bandwidth, the activation bytes it moves over its time (`pass_bytes`; the
  per-channel vectors are left out), against a device-to-device copy (`Tensor.copy_`) of the same
  number of bytes (half read, half written) timed in the same run: the target is 80% of the copy.
  stats and grad stats include their finalize kernels. Each timing is `--calls` calls captured in one
  CUDA graph and replayed, so launch overhead is not in it; the best of `--trials` replays.
- the whole BatchNorm, forward and backward, ours (ddp_train.fast.bn_blocks.batch_norm_act) against
  nn.BatchNorm2d + add + ReLU as inductor compiles it, both under torch.compile(mode="reduce-overhead")
  as the trainer runs them: --calls steps back to back, the best of three.

The first calls of our kernels (Triton's compiles) are timed and printed: they are the setup our
kernels add to a run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn

from ddp_train.config import GPU_BATCH_PER_RANK

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TARGET = 0.8  # of the copy's bandwidth
STAGES = ((160, 32), (320, 16), (640, 8))  # channels, size: the blocks of model.WideResNet at width 1
CHANNELS_LAST = dict(memory_format=torch.channels_last)


@dataclass(frozen=True)
class Case:
    batch: int
    channels: int
    size: int
    residual: bool  # bn2: + the shortcut, then ReLU; bn1: ReLU

    def label(self) -> str:
        return f"{self.channels}x{self.size}x{self.size} {'relu+add' if self.residual else 'relu'}"

    def activation_bytes(self, itemsize: int) -> int:
        return self.batch * self.channels * self.size * self.size * itemsize


def cases(batch: int) -> list[Case]:
    return [Case(batch, channels, size, residual) for channels, size in STAGES for residual in (False, True)]


def pass_bytes(activation: int, residual: bool) -> dict[str, int]:
    """Bytes each pass reads and writes over the activations (bn_kernels' docstring), ReLU on:
    stats reads x; apply reads x (and the residual), writes y; grad stats reads grad_y, y and x
    (and writes g, the residual's gradient); input reads grad_y and y, or g, and x, writes grad_x."""
    return {"stats": activation, "apply": (3 if residual else 2) * activation,
            "grad stats": (4 if residual else 3) * activation, "input": (3 if residual else 4) * activation}


@dataclass(frozen=True)
class PassRow:
    case: str
    name: str
    bytes: int
    seconds: float
    copy_seconds: float

    @property
    def of_copy(self) -> float:
        return self.copy_seconds / self.seconds

    def line(self) -> str:
        gbps, copy_gbps = self.bytes / self.seconds / 1e9, self.bytes / self.copy_seconds / 1e9
        mark = "" if self.of_copy >= TARGET else f"  (under {TARGET:.0%})"
        return (f"{self.case:<20} {self.name:<11} {self.bytes / 1e6:>9.1f} {self.seconds * 1e6:>9.1f} "
                f"{gbps:>8.0f} {copy_gbps:>9.0f} {self.of_copy:>8.1%}{mark}")


PASS_HEADER = f"{'case':<20} {'pass':<11} {'MB':>9} {'us':>9} {'GB/s':>8} {'copy GB/s':>9} {'of copy':>8}"


@dataclass(frozen=True)
class StepRow:
    case: str
    ours_ms: float
    inductor_ms: float
    ours_bytes: int

    def line(self) -> str:
        return (f"{self.case:<20} {self.ours_ms:>9.3f} {self.inductor_ms:>12.3f} {self.inductor_ms / self.ours_ms:>9.2f}x "
                f"{self.ours_bytes / self.ours_ms / 1e6:>9.0f}")


STEP_HEADER = f"{'case':<20} {'ours ms':>9} {'inductor ms':>12} {'speed-up':>10} {'ours GB/s':>9}"


def graph_seconds(fn: Callable[[], object], calls: int, trials: int) -> float:
    """Seconds per call of `fn`: `calls` calls captured in one CUDA graph (after a warm-up call on a
    side stream, as torch.cuda.graphs' docs do), the best of `trials` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    best = float("inf")
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / calls)
    return best


def copy_seconds(nbytes: int, calls: int, trials: int) -> float:
    """A device-to-device copy moving `nbytes` in all: nbytes / 2 read, nbytes / 2 written."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return graph_seconds(lambda: dst.copy_(src), calls, trials)


def case_tensors(case: Case, dtype: torch.dtype, device: str = "cuda"):
    torch.manual_seed(0)
    shape = (case.batch, case.channels, case.size, case.size)

    def activation() -> torch.Tensor:
        return torch.randn(shape, device=device).to(dtype).contiguous(**CHANNELS_LAST)
    x, grad_y = activation(), activation()
    residual = activation() if case.residual else None
    weight = torch.rand(case.channels, device=device) + 0.5
    bias = torch.randn(case.channels, device=device)
    return x, residual, grad_y, weight, bias


def time_passes(case: Case, dtype: torch.dtype, calls: int, trials: int, device: str = "cuda") -> list[PassRow]:
    from ddp_train.fast import bn_kernels
    x, residual, grad_y, weight, bias = case_tensors(case, dtype, device)
    rows, channels = bn_kernels.check_input(x)
    layout = bn_kernels.plan(rows, channels)
    batch = bn_kernels.stats(x, 1e-5, layout)
    y = bn_kernels.normalize(x, batch, weight, bias, residual, True, layout)
    terms = bn_kernels.grad_stats(grad_y, y, x, weight, batch.mean, batch.invstd, True, case.residual, layout)
    source = terms.g if terms.g is not None else grad_y
    passes: dict[str, Callable[[], object]] = {
        "stats": lambda: bn_kernels.stats(x, 1e-5, layout),
        "apply": lambda: bn_kernels.normalize(x, batch, weight, bias, residual, True, layout),
        "grad stats": lambda: bn_kernels.grad_stats(grad_y, y, x, weight, batch.mean, batch.invstd, True,
                                                    case.residual, layout),
        "input": lambda: bn_kernels.input_grad(source, y, x, batch.mean, terms, not case.residual, layout),
    }
    moved = pass_bytes(case.activation_bytes(x.element_size()), case.residual)
    return [PassRow(case.label(), name, moved[name], graph_seconds(fn, calls, trials),
                    copy_seconds(moved[name], calls, trials)) for name, fn in passes.items()]


def step_seconds(forward: Callable[..., torch.Tensor], x: torch.Tensor, residual: Optional[torch.Tensor],
                 grad_y: torch.Tensor, calls: int) -> float:
    """Seconds per forward + backward, compiled with CUDA graphs: `calls` steps back to back after
    three warm-up steps (graphs record on the second), the best of three such runs."""
    compiled = torch.compile(forward, mode="reduce-overhead", dynamic=False)
    # Both inputs need their gradients, as in the model: the residual's is the shortcut's.
    x = x.detach().requires_grad_()
    residual = residual.detach().requires_grad_() if residual is not None else None

    def steps(count: int) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(count):
            torch.compiler.cudagraph_mark_step_begin()
            x.grad = None
            if residual is not None:
                residual.grad = None
            compiled(x, residual).backward(grad_y)
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / count
    steps(3)
    return min(steps(calls) for _ in range(3))


def time_steps(case: Case, dtype: torch.dtype, calls: int) -> StepRow:
    from ddp_train.fast.bn_blocks import batch_norm_act
    x, residual, grad_y, _, _ = case_tensors(case, dtype)
    theirs, ours = nn.BatchNorm2d(case.channels).cuda(), nn.BatchNorm2d(case.channels).cuda()

    def inductor(x: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
        out = theirs(x)
        return torch.relu(out + residual if residual is not None else out)

    def triton(x: torch.Tensor, residual: Optional[torch.Tensor]) -> torch.Tensor:
        return batch_norm_act(x, ours, residual)
    seconds = {}
    for name, forward in (("inductor", inductor), ("ours", triton)):
        seconds[name] = step_seconds(forward, x, residual, grad_y, calls)
        torch._dynamo.reset()
    moved = sum(pass_bytes(case.activation_bytes(x.element_size()), case.residual).values())
    return StepRow(case.label(), seconds["ours"] * 1e3, seconds["inductor"] * 1e3, moved)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=GPU_BATCH_PER_RANK, help=f"images (default: {GPU_BATCH_PER_RANK})")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16", help="the activations' dtype (default: bf16)")
    p.add_argument("--calls", type=int, default=20, help="calls per timing (default: 20)")
    p.add_argument("--trials", type=int, default=3, help="replays per timing, the best kept (default: 3)")
    p.add_argument("--no-inductor", action="store_true", help="the passes only, not the compiled comparison")
    p.add_argument("--tile", type=int, help="elements per tile, a power of two (default: bn_kernels.TILE)")
    p.add_argument("--warps", type=int, help="warps per program (default: bn_kernels.NUM_WARPS)")
    p.add_argument("--programs", type=int, help="reduction programs per call (default: bn_kernels.TARGET_PROGRAMS)")
    p.add_argument("--json", type=Path, help="also write every row to this file")
    return p.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bn_bandwidth: no CUDA GPU is visible; run it on a GPU node", file=sys.stderr)
        return 2
    import triton
    from ddp_train.fast import bn_kernels
    dtype = DTYPES[args.dtype]
    for name, value in (("TILE", args.tile), ("NUM_WARPS", args.warps), ("TARGET_PROGRAMS", args.programs)):
        if value:
            setattr(bn_kernels, name, value)  # for this process: the kernels read them at each launch
    # Every case is a new shape for the same two functions: past the default limit (8) dynamo would
    # run the rest eagerly. torch/_dynamo/config.py: recompile_limit (cache_size_limit before).
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    print(f"bn_bandwidth: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{args.dtype}, batch {args.batch}, {args.calls} calls per timing, best of {args.trials}; tile "
          f"{bn_kernels.TILE}, {bn_kernels.NUM_WARPS} warps, {bn_kernels.TARGET_PROGRAMS} reduction programs")
    started = time.perf_counter()
    for case in cases(args.batch):  # every flag set and tile shape the model's BatchNorms launch
        x, residual, grad_y, weight, bias = case_tensors(case, dtype)
        y, mean, _, invstd = bn_kernels.forward(x, weight, bias, residual, True, 1e-5)
        bn_kernels.backward(grad_y, y, x, weight, mean, invstd, case.residual, True)
    torch.cuda.synchronize()
    print(f"  our kernels' first calls (Triton's compiles, the setup they add to a run): "
          f"{time.perf_counter() - started:.1f} s")
    records: list[dict] = []
    print(PASS_HEADER)
    passes: list[PassRow] = []
    for case in cases(args.batch):
        for row in time_passes(case, dtype, args.calls, args.trials):
            print(row.line(), flush=True)
            passes.append(row)
            records.append({"kind": "pass", **asdict(row), "of_copy": row.of_copy})
    print(f"  {sum(r.of_copy >= TARGET for r in passes)} of {len(passes)} passes at {TARGET:.0%} of the copy "
          f"or more; all passes together {sum(r.copy_seconds for r in passes) / sum(r.seconds for r in passes):.1%}")
    if not args.no_inductor:
        print(STEP_HEADER)
        steps = []
        for case in cases(args.batch):
            row = time_steps(case, dtype, args.calls)
            print(row.line(), flush=True)
            steps.append(row)
            records.append({"kind": "step", **asdict(row)})
        weights = {c.label(): 2 for c in cases(args.batch)}  # each shape is in two blocks of the model
        ours = sum(weights[r.case] * r.ours_ms for r in steps)
        theirs = sum(weights[r.case] * r.inductor_ms for r in steps)
        print(f"  the model's 12 block BatchNorms, forward + backward: ours {ours:.2f} ms, inductor's {theirs:.2f} ms")
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "dtype": args.dtype, "batch": args.batch, "rows": records}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
