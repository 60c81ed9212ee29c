"""Training images/s of the trainer's step, variant by variant, in one run, against the guide's
DataLoader pipeline and the device's own measured matmul ceiling.

    python benchmarks/gpu_throughput.py                       # CUDA: full model, bf16, b1024, every variant
    python benchmarks/gpu_throughput.py --list                # the variants and their inductor options
    python benchmarks/gpu_throughput.py --device cpu          # CPU: width 1/16, fp32, a few steps
    python benchmarks/gpu_throughput.py --variants graphs,triton-bn --precisions bf16,fp16   # fp16 beside bf16

Variants (each the trainer's real step: on-device crop/flip, cached normalisation, autocast,
fused SGD, no sync inside the timed steps): eager; compiled (torch.compile, no CUDA graphs);
graphs (mode="reduce-overhead", the trainer's CUDA default); one variant per inductor lever on
top of graphs (VARIANTS below: each sets torch._inductor.config options while it compiles and
runs); max-autotune, whose tuning results go to the persistent compile cache (--compile-cache-dir,
resolved as the trainer resolves it); all-levers; and the fused residual blocks
(ddp_train.fast.fused_blocks), with the reference kernels and with the cuDNN-frontend ones
(ddp_train.fast.cudnn_blocks; "not run" with the reason where they cannot run); and our Triton BatchNorm
kernels (triton-bn: ddp_train.fast.bn_blocks, the trainer's --bn-kernels triton). Each row says
whether its step ran as a CUDA graph, and inductor's reason where it did not. An option this torch does not have is reported in the table, not run.

Precisions (--precisions, default bf16 on CUDA, fp32 on CPU): bf16 autocast, or fp16 autocast with
the trainer's loss scaling on the device (ddp_train.fast.loss_scale: scale, inf check, skip and update with
no host sync) and fused SGD. With several, each variant is built and warmed once per precision, and
the timed steps alternate between them in --rounds rounds in one process, so both see the same card,
clocks and neighbours; each precision's row is its best round, and a line gives the ratio to the
first precision, round by round.
The baseline is benchmarks/trainer_throughput.py's reproduction of the guide's pipeline
(torchvision + DataLoader workers, fp16 on GPU). FLOP/s counts 6 x the forward
multiply-accumulates per image (forward 2, backward 4), the usual rule for convolutions and
linears; the ceiling is a large matmul timed in the same run (bf16 on CUDA, fp32 on CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn as nn

from ddp_train.fast import cudagraph_report, fused_blocks, levers, speed
from ddp_train.fast.bn_blocks import TritonBasicBlock
from ddp_train.config import GPU_BATCH_PER_RANK
from ddp_train.recipe.data import memory_format_for, normalize, random_crop_flip
from ddp_train.fast.fused_blocks import FusedBasicBlock
from ddp_train.fast.loss_scale import LossScaler
from ddp_train.recipe.model import BasicBlock, WideResNet

# The step's autocast dtype per --precisions name (None: fp32, no autocast); fp16 is loss-scaled.
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


@dataclass(frozen=True)
class Variant:
    """One way to run the step: a torch.compile mode (None: eager), inductor options set while it
    compiles and runs, and the block the model is built from."""
    name: str
    mode: Optional[str]
    what: str
    inductor: tuple[tuple[str, Any], ...] = ()  # torch._inductor.config names, dotted as config.patch takes them
    fused_blocks: bool = False
    cudnn_kernels: bool = False  # the fused blocks with the cuDNN-frontend kernels plugged in
    triton_bn: bool = False  # the blocks' BatchNorms on our Triton kernels (ddp_train.fast.bn_blocks)

    def needs_cuda(self) -> bool:
        return self.mode in cudagraph_report.CUDA_GRAPH_MODES


# The levers for the memory-bound part of the step (BatchNorm statistics and normalisation, ReLU,
# the residual add), each measured alone on top of the trainer's default (reduce-overhead); the
# trainer takes the same names (--inductor-levers, ddp_train/fast/levers.py).
# All together: cooperative reductions stand for both reduction levers (inductor turns split
# reductions off when both are on), under max-autotune.
ALL_LEVERS = levers.options(("coop-reductions", "conv1x1-mm", "pdl", "combo-kernels"))

VARIANTS = (
    Variant("eager", None, "no torch.compile"),
    Variant("compiled", "default", "torch.compile, no CUDA graphs"),
    Variant("graphs", "reduce-overhead", "torch.compile with CUDA graphs: the trainer's CUDA default"),
    *(Variant(name, "reduce-overhead", f"graphs + {what}", options) for name, (what, options) in levers.LEVERS.items()),
    Variant("max-autotune", "max-autotune", "graphs + autotuned kernels, tuning kept in the compile cache"),
    Variant("all-levers", "max-autotune", "max-autotune + every lever above", ALL_LEVERS),
    Variant("fused-blocks", "reduce-overhead", "graphs + the fused blocks' custom ops (the reference "
            "kernels)", fused_blocks=True),
    Variant("fused-cudnn", "reduce-overhead", "graphs + the fused blocks with the cuDNN-frontend kernels "
            "(ddp_train.fast.cudnn_blocks)", fused_blocks=True, cudnn_kernels=True),
    Variant("eager-fused", None, "eager + the fused blocks' custom ops", fused_blocks=True),
    Variant("triton-bn", "reduce-overhead", "graphs + the blocks' BatchNorm, ReLU and residual add on our "
            "Triton kernels (ddp_train.fast.bn_blocks, --bn-kernels triton)", triton_bn=True),
)
BY_NAME = {v.name: v for v in VARIANTS}


@dataclass(frozen=True)
class Result:
    variant: str
    batch: int
    images_per_s: Optional[float]  # None: not run (the note says why); the best round
    note: str = ""
    setup_s: Optional[float] = None  # the warm-up steps: compile, autotune, graph recording
    graphs: str = "-"  # whether the step ran as a CUDA graph (cudagraph_report)
    precision: str = "-"
    rounds: tuple[float, ...] = ()  # images/s of each timed round, in the order they ran


def inductor_option(name: str) -> Any:
    """The current value of a dotted torch._inductor.config name ("triton.enable_pdl")."""
    import torch._inductor.config as inductor_config
    return functools.reduce(getattr, name.split("."), inductor_config)


def missing_options(variant: Variant) -> list[str]:
    """The variant's options this torch does not have (the GPU image's torch may be older)."""
    return levers.missing(variant.inductor)


@contextlib.contextmanager
def inductor_options(variant: Variant) -> Iterator[None]:
    """The variant's options while it compiles and runs (a mode and options cannot both be
    passed to torch.compile, so they are patched around it)."""
    if not variant.inductor:
        yield
        return
    import torch._inductor.config as inductor_config
    with inductor_config.patch(dict(variant.inductor)):
        yield


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--list", action="store_true", help="list the variants, their options and whether this "
                   "torch has them, and stop")
    p.add_argument("--width-scale", type=float, help="default: 1.0 on cuda, 1/16 on cpu")
    p.add_argument("--batches", help=f"per-GPU batch sizes, comma-separated (default: {GPU_BATCH_PER_RANK}, the "
                   f"trainer's, on cuda; 32,64 on cpu)")
    p.add_argument("--variants", default=",".join(v.name for v in VARIANTS),
                   help=f"subset of {','.join(v.name for v in VARIANTS)}")
    p.add_argument("--precisions", help=f"comma-separated, of {', '.join(AUTOCAST)} (default: bf16 on cuda, fp32 on "
                   f"cpu); several alternate in rounds in one process")
    p.add_argument("--rounds", type=int, help="timed rounds per precision, alternating (default: 3 with several "
                   "precisions, else 1)")
    p.add_argument("--steps", type=int, help="timed steps per variant and round (default: 50 cuda, 3 cpu)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (compile, autotune, graphs), "
                   "reported as setup")
    p.add_argument("--dropout", type=float, default=0.0, help="the improved recipe's 0 (guide: 0.01)")
    p.add_argument("--baseline-images", type=int, help="images per guide-pipeline epoch "
                   "(default: 10240 cuda, 256 cpu); 0 skips the baseline")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="guide DataLoader workers")
    p.add_argument("--matmul-size", type=int, help="square matmul for the ceiling (default: 8192 cuda, 1024 cpu)")
    p.add_argument("--json", type=Path, help="also write the rows to this file (a list of objects), as each "
                   "finishes: what a script reads to pick the levers that win")
    p.add_argument("--compile-cache-dir", default="", help="inductor's persistent cache, as the trainer's flag: "
                   "> $TORCHINDUCTOR_CACHE_DIR > a new temporary directory (a cold start). Run twice with the "
                   "same directory: the second run's setup is what a requeued job pays")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available() and not args.list:
        p.error("--device cuda but no CUDA GPU is visible")
    args.width_scale = args.width_scale or (1.0 if cuda else 1 / 16)
    args.batches = [int(b) for b in (args.batches or (str(GPU_BATCH_PER_RANK) if cuda else "32,64")).split(",")]
    names = [v for v in args.variants.split(",") if v]
    unknown = set(names) - set(BY_NAME)
    if unknown:
        p.error(f"unknown variant(s) {', '.join(sorted(unknown))}: use {', '.join(BY_NAME)}")
    args.variants = [BY_NAME[name] for name in names]
    args.precisions = [name for name in (args.precisions or ("bf16" if cuda else "fp32")).split(",") if name]
    wrong = [name for name in args.precisions if name not in AUTOCAST] or len(set(args.precisions)) < len(args.precisions)
    if wrong or not args.precisions:
        p.error(f"--precisions {','.join(args.precisions)}: name each of {', '.join(AUTOCAST)} at most once")
    args.rounds = args.rounds or (3 if len(args.precisions) > 1 else 1)
    args.steps = args.steps or (50 if cuda else 3)
    args.baseline_images = args.baseline_images if args.baseline_images is not None else (10240 if cuda else 256)
    args.matmul_size = args.matmul_size or (8192 if cuda else 1024)
    return args


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def forward_macs_per_image(model: nn.Module, device: torch.device) -> int:
    """Multiply-accumulates of the convolutions and linears for one 32x32 image, counted by hooks."""
    macs = 0

    def count(module: nn.Module, _inputs, output: torch.Tensor) -> None:
        nonlocal macs
        if isinstance(module, nn.Conv2d):
            per_output = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1]
            macs += output[0].numel() * per_output
        elif isinstance(module, nn.Linear):
            macs += output[0].numel() * module.in_features
    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        model(torch.zeros(1, 3, 32, 32, device=device).contiguous(memory_format=memory_format_for(device)))
    model.train(was_training)
    for h in hooks:
        h.remove()
    return macs


def matmul_ceiling(device: torch.device, size: int) -> float:
    """FLOP/s of a square matmul: bf16 on CUDA (tensor cores), fp32 on CPU."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(2):
        a @ b
    synchronize(device)
    repeats = 20 if device.type == "cuda" else 3
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2 * size ** 3 * repeats / (time.perf_counter() - start)


def block_of(variant: Variant) -> type[BasicBlock]:
    if variant.fused_blocks:
        return FusedBasicBlock
    return TritonBasicBlock if variant.triton_bn else BasicBlock


def make_step(args: argparse.Namespace, device: torch.device, variant: Variant, batch: int, precision: str
              ) -> Callable[[int], torch.Tensor]:
    """The trainer's step on resident uint8 data, as ddp_train.recipe.learner builds it for `precision`
    (autocast, fp16's loss scaling, fused SGD); returns step(i) -> detached loss."""
    torch.manual_seed(0)
    model = WideResNet(100, args.width_scale, args.dropout, block=block_of(variant)).to(
        device, memory_format=memory_format_for(device))
    cuda, autocast_dtype = device.type == "cuda", AUTOCAST[precision]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4, fused=cuda or precision == "fp16")
    scaler = LossScaler(device, enabled=precision == "fp16")
    forward = torch.compile(model, mode=variant.mode) if variant.mode else model
    images = torch.randint(0, 256, (4 * batch, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 100, (4 * batch,), device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    def step(i: int) -> torch.Tensor:
        lo = (i % 4) * batch
        x = normalize(random_crop_flip(images[lo:lo + batch], 4, generator))
        if variant.needs_cuda():
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32, enabled=autocast_dtype is not None):
            loss = criterion(forward(x), labels[lo:lo + batch])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def not_run_because(variant: Variant, device: torch.device) -> str:
    if variant.needs_cuda() and device.type != "cuda":
        return "CUDA graphs need a GPU"
    missing = missing_options(variant)
    if missing:
        return f"torch {torch.__version__} has no inductor option {', '.join(missing)}"
    if variant.triton_bn and device.type != "cuda":
        return "our Triton kernels need a GPU (on CPU Triton only interprets, for tests)"
    if variant.cudnn_kernels:
        if device.type != "cuda":
            return "the cuDNN kernels need a GPU"
        from ddp_train.fast import cudnn_blocks
        return cudnn_blocks.unavailable_reason()
    return ""


@contextlib.contextmanager
def block_kernels(variant: Variant) -> Iterator[None]:
    """The cuDNN kernels plugged in for this variant alone: the variants after it run the reference."""
    if not variant.cudnn_kernels:
        yield
        return
    from ddp_train.fast import cudnn_blocks
    before = fused_blocks.KERNELS.get("cuda")
    print(f"  {variant.name}: {cudnn_blocks.use_cudnn_kernels()}", flush=True)
    try:
        yield
    finally:
        if before is None:
            fused_blocks.unplug("cuda")
        else:
            fused_blocks.plug_in("cuda", before)


def measure(args: argparse.Namespace, device: torch.device, variant: Variant, batch: int) -> list[Result]:
    """The variant at `batch` in each of --precisions: built and warmed one after the other, then
    timed in --rounds rounds that alternate between them; one Result per precision."""
    reason = not_run_because(variant, device)
    if reason:
        return [Result(variant.name, batch, None, reason, precision=p) for p in args.precisions]
    watch = cudagraph_report.SkipWatch.start() if variant.mode else None
    steps: dict[str, Callable[[int], torch.Tensor]] = {}
    setup: dict[str, float] = {}
    rounds: dict[str, list[float]] = {p: [] for p in args.precisions}
    try:
        with inductor_options(variant), block_kernels(variant):
            for precision in args.precisions:
                steps[precision] = make_step(args, device, variant, batch, precision)
                started = time.perf_counter()
                for i in range(args.warmup_steps):
                    steps[precision](i)
                synchronize(device)
                setup[precision] = time.perf_counter() - started
            graphs = cudagraph_report.observe(device.type, device.index, variant.mode is not None,
                                              variant.mode or "eager", watch).text()
            for _ in range(args.rounds):
                for precision, step in steps.items():
                    start = time.perf_counter()
                    for i in range(args.steps):
                        step(i)
                    synchronize(device)
                    rounds[precision].append(batch * args.steps / (time.perf_counter() - start))
    except Exception as exc:  # one variant's failure (an option this GPU or torch rejects) is a row, not the end
        traceback.print_exc()
        note = f"failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        return [Result(variant.name, batch, None, note, precision=p) for p in args.precisions]
    finally:
        if watch is not None:
            watch.stop()
        steps.clear()  # the models, their graphs and their memory pool, before the next variant compiles
        torch._dynamo.reset()  # also resets the CUDA-graph trees: the next variant counts its own graphs
    return [Result(variant.name, batch, max(rounds[p]), setup_s=setup[p], graphs=graphs, precision=p,
                   rounds=tuple(rounds[p])) for p in args.precisions]


def ratio_line(results: list[Result]) -> Optional[str]:
    """Each precision against the first: best round to best round, then round by round (same order)."""
    first = results[0]
    others = [r for r in results[1:] if r.images_per_s is not None]
    if first.images_per_s is None or not others:
        return None
    parts = [f"{r.precision}/{first.precision} {r.images_per_s / first.images_per_s:.3f}x (rounds: "
             f"{', '.join(f'{a / b:.3f}' for a, b in zip(r.rounds, first.rounds))})" for r in others]
    return f"  {first.variant} at batch {first.batch}: {'; '.join(parts)}"


def guide_baseline(args: argparse.Namespace, batch: int) -> float:
    """The guide's pipeline from trainer_throughput.py, one warm-up epoch and one timed."""
    from trainer_throughput import run_seed_pipeline  # beside this script, first on sys.path
    from ddp_train.synthetic import write_dataset

    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        write_dataset(Path(tmp), train=args.baseline_images, test=100, seed=0)
        seed_args = argparse.Namespace(device=args.device, train_images=args.baseline_images,
                                       batch_size=batch, workers=args.workers,
                                       width_scale=args.width_scale, epochs=2, data_dir=None)
        return run_seed_pipeline(seed_args, Path(tmp))


HEADER = (f"{'variant':<19} {'batch':>6} {'precision':>9} {'images/s':>11} {'TFLOP/s':>9} {'of ceiling':>10} "
          f"{'vs guide':>9} {'setup s':>8}  CUDA graphs")


def row(r: Result, baseline: Optional[float], flops_per_image: float, ceiling: float) -> str:
    """One table row; printed as soon as its variant is measured, so a cut-off run keeps its rows."""
    if r.images_per_s is None:
        return f"{r.variant:<19} {r.batch:>6} {r.precision:>9} {'-':>11} {'-':>9} {'-':>10} {'-':>9} {'-':>8}  - ({r.note})"
    flops = r.images_per_s * flops_per_image
    ratio = f"{r.images_per_s / baseline:>8.2f}x" if baseline else f"{'-':>9}"
    # Three significant figures, not one decimal: an eager warm-up step on a fast CPU takes 0.04 s,
    # which one decimal printed as 0.0, as if nothing had been measured.
    setup = f"{r.setup_s:>8.3g}" if r.setup_s is not None else f"{'-':>8}"
    return (f"{r.variant:<19} {r.batch:>6} {r.precision:>9} {r.images_per_s:>11,.1f} {flops / 1e12:>9.3f} "
            f"{flops / ceiling:>10.1%} {ratio} {setup}  {r.graphs}")


def listing(variants: list[Variant]) -> str:
    """Each variant, its mode and options, and any option this torch lacks (the --list output)."""
    lines = [f"variants (torch {torch.__version__}; options: torch._inductor.config):"]
    for v in variants:
        options = ", ".join(f"{name}={value}" for name, value in v.inductor)
        missing = missing_options(v)
        lines.append(f"  {v.name:<19} mode={v.mode or 'eager'}{'; ' + options if options else ''}"
                     f"{'; fused blocks' if v.fused_blocks else ''}{'; triton BatchNorm' if v.triton_bn else ''}: {v.what}"
                     f"{'  [NOT IN THIS TORCH: ' + ', '.join(missing) + ']' if missing else ''}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.list:
        print(listing(args.variants))
        return 0
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as scratch:
        # Before anything compiles (and before torch writes its /tmp default into os.environ).
        cache = speed.compile_cache_dir(args.compile_cache_dir, scratch, os.environ)
        speed.use_compile_cache(cache, os.environ)
        return run(args, cache)


def run(args: argparse.Namespace, cache: Path) -> int:
    device = torch.device(args.device)
    if device.type == "cuda":
        speed.tune_backends(device)
        what = torch.cuda.get_device_name(device)
    else:
        what = f"CPU, {torch.get_num_threads()} threads"
    model = WideResNet(100, args.width_scale, args.dropout).to(device, memory_format=memory_format_for(device))
    flops_per_image = 6 * forward_macs_per_image(model, device)
    del model
    ceiling = matmul_ceiling(device, args.matmul_size)
    precision = ", ".join(f"{p} ({'autocast, loss-scaled' if p == 'fp16' else 'autocast' if AUTOCAST[p] else 'no autocast'})"
                          for p in args.precisions)
    print(f"gpu_throughput: {args.device} ({what}), torch {torch.__version__}, width scale {args.width_scale:g}, "
          f"{precision}, dropout {args.dropout:g}, {args.rounds} x {args.steps} timed steps after {args.warmup_steps} "
          f"warm-up")
    print(f"  {flops_per_image / 1e9:.3f} GFLOP per training image; matmul ceiling "
          f"{ceiling / 1e12:.3f} TFLOP/s ({args.matmul_size}^2, {'bf16' if device.type == 'cuda' else 'fp32'})")
    print(f"  compile cache: {cache}")
    print(listing(args.variants))
    baseline_batch = min(args.batches)
    baseline = guide_baseline(args, baseline_batch) if args.baseline_images else None
    print(HEADER)
    if baseline is not None:
        guide_precision = "fp16" if device.type == "cuda" else "fp32"
        print(f"{'guide':<19} {baseline_batch:>6} {guide_precision:>9} {baseline:>11,.1f} "
              f"{baseline * flops_per_image / 1e12:>9.3f} "
              f"{baseline * flops_per_image / ceiling:>10.1%} {1:>8.2f}x {'-':>8}  -", flush=True)
    rows: list[dict[str, Any]] = []
    for batch in args.batches:
        for variant in args.variants:
            results = measure(args, device, variant, batch)
            for result in results:
                print(row(result, baseline, flops_per_image, ceiling), flush=True)
                if args.json:
                    rows.append({**dataclasses.asdict(result), "gpu": what, "torch": torch.__version__,
                                 "of_ceiling": (result.images_per_s or 0) * flops_per_image / ceiling,
                                 "guide": baseline})
                    args.json.write_text(json.dumps(rows, indent=1) + "\n")
            ratios = ratio_line(results)
            if ratios:
                print(ratios, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
