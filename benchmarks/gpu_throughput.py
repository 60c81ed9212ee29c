"""Training images/s of the trainer's step, variant by variant, in one run, against the guide's
DataLoader pipeline and the device's own measured matmul ceiling.

    python benchmarks/gpu_throughput.py                       # CUDA: full model, bf16, b256/512/1024
    python benchmarks/gpu_throughput.py --device cpu          # CPU: width 1/16, fp32, a few steps

Variants (each the trainer's real step: on-device crop/flip, cached normalisation, autocast,
fused SGD, no sync inside the timed steps): eager; compiled (torch.compile, no CUDA graphs);
graphs (mode="reduce-overhead", CUDA only). The baseline is benchmarks/trainer_throughput.py's
reproduction of the guide's pipeline (torchvision + DataLoader workers, fp16 on GPU).
FLOP/s counts 6 x the forward multiply-accumulates per image (forward 2, backward 4), the usual
rule for convolutions and linears; the ceiling is a large matmul timed in the same run
(bf16 on CUDA, fp32 on CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn as nn

from ddp_train.augment import random_crop_flip
from ddp_train.data import memory_format_for, normalize
from ddp_train.model import WideResNet

VARIANTS = ("eager", "compiled", "graphs")
COMPILE_MODES = {"eager": None, "compiled": "default", "graphs": "reduce-overhead"}  # as --compile-mode


@dataclass(frozen=True)
class Result:
    variant: str
    batch: int
    images_per_s: Optional[float]  # None: not run on this device
    note: str = ""


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width-scale", type=float, help="default: 1.0 on cuda, 1/16 on cpu")
    p.add_argument("--batches", help="per-GPU batch sizes, comma-separated (default: 256,512,1024 on cuda, 32,64 on cpu)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    p.add_argument("--steps", type=int, help="timed steps per variant (default: 50 cuda, 3 cpu)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (compile, autotune, graphs)")
    p.add_argument("--dropout", type=float, default=0.0, help="the improved recipe's 0 (guide: 0.01)")
    p.add_argument("--baseline-images", type=int, help="images per guide-pipeline epoch "
                   "(default: 10240 cuda, 256 cpu); 0 skips the baseline")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1), help="guide DataLoader workers")
    p.add_argument("--matmul-size", type=int, help="square matmul for the ceiling (default: 8192 cuda, 1024 cpu)")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda but no CUDA GPU is visible")
    args.width_scale = args.width_scale or (1.0 if cuda else 1 / 16)
    args.batches = [int(b) for b in (args.batches or ("256,512,1024" if cuda else "32,64")).split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variant(s) {', '.join(sorted(unknown))}: use {', '.join(VARIANTS)}")
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


def make_step(args: argparse.Namespace, device: torch.device, variant: str, batch: int
              ) -> Callable[[int], torch.Tensor]:
    """The trainer's step on resident uint8 data; returns step(i) -> detached loss."""
    torch.manual_seed(0)
    model = WideResNet(100, args.width_scale, args.dropout).to(device, memory_format=memory_format_for(device))
    cuda = device.type == "cuda"
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4, fused=cuda)
    mode = COMPILE_MODES[variant]
    forward = torch.compile(model, mode=mode) if mode else model
    images = torch.randint(0, 256, (4 * batch, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 100, (4 * batch,), device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    def step(i: int) -> torch.Tensor:
        lo = (i % 4) * batch
        x = normalize(random_crop_flip(images[lo:lo + batch], 4, generator))
        if variant == "graphs":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = criterion(forward(x), labels[lo:lo + batch])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def measure(args: argparse.Namespace, device: torch.device, variant: str, batch: int) -> Result:
    if variant == "graphs" and device.type != "cuda":
        return Result(variant, batch, None, "CUDA graphs need a GPU")
    step = make_step(args, device, variant, batch)
    for i in range(args.warmup_steps):
        step(i)
    synchronize(device)
    start = time.perf_counter()
    for i in range(args.steps):
        step(i)
    synchronize(device)
    return Result(variant, batch, batch * args.steps / (time.perf_counter() - start))


def guide_baseline(args: argparse.Namespace, batch: int) -> float:
    """The guide's pipeline from trainer_throughput.py, one warm-up epoch and one timed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from trainer_throughput import run_seed_pipeline
    from ddp_train.synthetic import write_dataset

    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        write_dataset(Path(tmp), train=args.baseline_images, test=100, seed=0)
        seed_args = argparse.Namespace(device=args.device, train_images=args.baseline_images,
                                       batch_size=batch, workers=args.workers,
                                       width_scale=args.width_scale, epochs=2, data_dir=None)
        return run_seed_pipeline(seed_args, Path(tmp))


def table(results: list[Result], baseline: Optional[float], baseline_batch: int, flops_per_image: float,
          ceiling: float) -> str:
    lines = [f"{'variant':<10} {'batch':>6} {'images/s':>11} {'TFLOP/s':>9} {'of ceiling':>10} {'vs guide':>9}"]
    if baseline is not None:
        lines.append(f"{'guide':<10} {baseline_batch:>6} {baseline:>11,.1f} {baseline * flops_per_image / 1e12:>9.3f} "
                     f"{baseline * flops_per_image / ceiling:>10.1%} {1:>8.2f}x")
    for r in results:
        if r.images_per_s is None:
            lines.append(f"{r.variant:<10} {r.batch:>6} {'-':>11} {'-':>9} {'-':>10} {'-':>9}  ({r.note})")
            continue
        flops = r.images_per_s * flops_per_image
        ratio = f"{r.images_per_s / baseline:>8.2f}x" if baseline else f"{'-':>9}"
        lines.append(f"{r.variant:<10} {r.batch:>6} {r.images_per_s:>11,.1f} {flops / 1e12:>9.3f} "
                     f"{flops / ceiling:>10.1%} {ratio}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
        what = torch.cuda.get_device_name(device)
    else:
        what = f"CPU, {torch.get_num_threads()} threads"
    model = WideResNet(100, args.width_scale, args.dropout).to(device, memory_format=memory_format_for(device))
    flops_per_image = 6 * forward_macs_per_image(model, device)
    del model
    ceiling = matmul_ceiling(device, args.matmul_size)
    precision = "bf16 autocast" if device.type == "cuda" else "fp32"
    print(f"gpu_throughput: {args.device} ({what}), torch {torch.__version__}, width scale {args.width_scale:g}, "
          f"{precision}, dropout {args.dropout:g}, {args.steps} timed steps after {args.warmup_steps} warm-up")
    print(f"  {flops_per_image / 1e9:.3f} GFLOP per training image; matmul ceiling "
          f"{ceiling / 1e12:.3f} TFLOP/s ({args.matmul_size}^2, {'bf16' if device.type == 'cuda' else 'fp32'})")
    results = [measure(args, device, variant, batch) for batch in args.batches for variant in args.variants]
    baseline_batch = min(args.batches)
    baseline = guide_baseline(args, baseline_batch) if args.baseline_images else None
    print(table(results, baseline, baseline_batch, flops_per_image, ceiling))
    return 0


if __name__ == "__main__":
    sys.exit(main())
