"""Training images/s: our trainer vs the Olivia guide's input pipeline, same model, data and machine.

    python benchmarks/trainer_throughput.py                               # CPU, narrow model
    python benchmarks/trainer_throughput.py --device cuda --width-scale 1  # GPU, the guide's model

"ours" runs the real `python -m ddp_train` (world of 1, --recipe guide) once per --precisions
entry (on CPU: fp32, the old default, and bf16, the default where the CPU computes it natively)
and reads its per-epoch images/s from metrics.jsonl. "seed" reproduces the guide's loop in this
process: torchvision CIFAR100 + DataLoader(workers, shuffle) with per-image RandomCrop(32, 4),
RandomHorizontalFlip, ToTensor, Normalize; fp16 autocast + GradScaler on GPU (fp32 on CPU, where
the guide's autocast("cuda") casts nothing); a fresh DataLoader iterator each epoch, timed from
iterator creation as the guide does. Both time training only (no evaluation) and skip the first
(warm-up) epoch. With --rounds N every side runs N times, in an order that alternates between
rounds, and the median is reported: a machine shared with other work slows every side alike.

"forensics on/off" runs two gloo CPU workers under ddp-launch with the heartbeat, the step
clock and its comm hook on (the default) and off (DDP_FORENSICS=0), interleaved, and times
the per-step heartbeat and clock marks alone: the cost of hang and straggler forensics.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ddp_train.layout import has_dataset
from ddp_train.metrics import read_metrics
from ddp_train.recipe.model import WideResNet
from ddp_train.precision import choose_precision, read_cpu_bf16
from ddp_train.synthetic import write_dataset

MEAN, STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--width-scale", type=float, help="default: 1/16 on cpu, 1.0 on cuda")
    p.add_argument("--batch-size", type=int, help="default: 128 on cpu, 256 on cuda (the guide's per GPU)")
    p.add_argument("--train-images", type=int, help="generated set size (default: 2048 cpu, 50000 cuda)")
    p.add_argument("--epochs", type=int, default=3, help="per side; the first is warm-up (default: 3)")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="DataLoader workers for the seed side (the guide uses 8)")
    p.add_argument("--data-dir", help="use this CIFAR-100 instead of generating one")
    p.add_argument("--precisions", help="ddp-train --precision values for ours, comma-separated "
                                        "(default: fp32,bf16 on cpu, auto on cuda)")
    p.add_argument("--rounds", type=int, default=1, help="alternating rounds of every side, median reported")
    p.add_argument("--json", action="store_true", help="also print one JSON line with the figures")
    p.add_argument("--forensics-repeats", type=int, default=3,
                   help="on/off pairs of 2-worker runs for the forensics overhead (0: skip)")
    p.add_argument("--forensics-only", action="store_true", help="only the forensics on/off comparison")
    args = p.parse_args()
    cuda = args.device == "cuda"
    args.width_scale = args.width_scale or (1.0 if cuda else 1 / 16)
    args.batch_size = args.batch_size or (256 if cuda else 128)
    args.train_images = args.train_images or (50000 if cuda else 2048)
    args.precisions = [x for x in (args.precisions or ("auto" if cuda else "fp32,bf16")).split(",") if x]
    if args.epochs < 2:
        p.error("--epochs must be at least 2 (the first one is warm-up)")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def run_ours(args: argparse.Namespace, data_dir: Path, run_dir: Path, precision: str = "auto") -> tuple[float, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "ddp_train", "--data-dir", str(data_dir), "--run-dir", str(run_dir),
           "--recipe", "guide", "--precision", precision, "--device", args.device, "--width-scale", str(args.width_scale),
           "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
           "--limit-train", str(args.train_images), "--limit-test", "1000",
           "--target-accuracy", "2", "--checkpoint-every", "0", "--no-resume"]
    if not args.data_dir:
        cmd.append("--allow-unverified-data")
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    records = read_metrics(run_dir / "metrics.jsonl")
    epochs = [r for r in records if r["type"] == "epoch"][1:]
    run = next(r for r in records if r["type"] == "run")
    return statistics.mean(e["images_per_s"] for e in epochs), run


def run_seed_pipeline(args: argparse.Namespace, data_dir: Path) -> float:
    import torchvision
    import torchvision.datasets.cifar as cifar
    import torchvision.transforms as T

    if not args.data_dir:  # generated files are not the official ones; skip torchvision's md5s
        cifar.check_integrity = lambda *a, **k: True
    device = torch.device(args.device)
    transform = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.CIFAR100(str(data_dir), train=True, download=False,
                                            transform=transform)
    dataset = torch.utils.data.Subset(dataset, range(min(args.train_images, len(dataset))))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                         num_workers=args.workers, pin_memory=device.type == "cuda",
                                         drop_last=True)
    torch.manual_seed(0)
    model = WideResNet(100, args.width_scale).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    cuda = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    loss_fn = torch.nn.CrossEntropyLoss()
    rates = []
    for _ in range(args.epochs):
        model.train()
        t0 = time.perf_counter()
        images = 0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.float16, enabled=cuda):
                loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            images += x.shape[0]
        if cuda:
            torch.cuda.synchronize()
        rates.append(images / (time.perf_counter() - t0))
    return statistics.mean(rates[1:])


def forensics_marks_us(buckets: int = 8, steps: int = 20000) -> float:
    """Microseconds per step of the heartbeat and step-clock marks a DDP step makes."""
    from ddp_contract import heartbeat as hb
    from ddp_train.safety.heartbeat import Forensics
    from ddp_train.safety.steptime import StepClock

    with tempfile.TemporaryDirectory(prefix="hb-bench-") as beats:
        forensics = Forensics.start({hb.HEARTBEAT_DIR_VAR: beats}, 0, 0, beats, 600.0)
        beat, clock = forensics.heartbeat, StepClock(torch.device("cpu"))
        start = time.perf_counter()
        for step in range(steps):
            beat.step(step)
            clock.begin()
            clock.forward_started()
            for _ in range(buckets):
                beat.bucket()
                clock.bucket()
            clock.backward_done()
            beat.phase(hb.OPTIMIZER)
            clock.end()
        elapsed = time.perf_counter() - start
        forensics.stop()
    return elapsed / steps * 1e6


def run_launched(args: argparse.Namespace, data_dir: Path, run_dir: Path, forensics: bool) -> tuple[float, float]:
    """(steady images/s, median step ms) of two CPU workers under ddp-launch."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["DDP_FORENSICS"] = "1" if forensics else "0"
    cmd = [sys.executable, "-m", "ddp_launch", "--cpu-workers", "2", "--", "--data-dir", str(data_dir),
           "--run-dir", str(run_dir), "--recipe", "guide", "--device", "cpu", "--width-scale",
           str(args.width_scale), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
           "--limit-train", str(args.train_images), "--limit-test", "256", "--target-accuracy", "2",
           "--checkpoint-every", "0", "--no-resume"]
    if not args.data_dir:
        cmd.append("--allow-unverified-data")
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = read_metrics(run_dir / "metrics.jsonl")
    epochs = [r for r in records if r["type"] == "epoch"][1:]
    steady = sum(e["images"] for e in epochs) / sum(e["epoch_time_s"] for e in epochs)
    summary = [r for r in records if r["type"] == "summary"][-1]
    step_ms = statistics.median(r["step_ms"] for r in summary.get("step_times") or [{"step_ms": 0.0}])
    return steady, step_ms


def forensics_overhead(args: argparse.Namespace, data_dir: Path, tmp: Path) -> dict:
    """Interleaved on/off pairs, so a busy machine's drift falls on both sides alike."""
    on, off, step_ms = [], [], []
    for i in range(args.forensics_repeats):
        for enabled in ((True, False) if i % 2 == 0 else (False, True)):
            rate, ms = run_launched(args, data_dir, tmp / f"fr-{i}-{int(enabled)}", enabled)
            (on if enabled else off).append(rate)
            if enabled:
                step_ms.append(ms)
    marks_us = forensics_marks_us()
    return {"on_images_per_s": statistics.median(on), "off_images_per_s": statistics.median(off),
            "on_off_ratio": statistics.median(a / b for a, b in zip(on, off)),
            "pairs": len(on), "marks_us_per_step": marks_us, "step_ms": statistics.median(step_ms),
            "marks_share": marks_us / 1000 / statistics.median(step_ms) if step_ms[0] else None}


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="trainer-bench-") as tmp:
        data_dir = Path(args.data_dir or Path(tmp) / "data")
        if not args.data_dir:
            write_dataset(data_dir, train=args.train_images, test=1000, seed=0)
        elif not has_dataset(data_dir):
            sys.exit(f"trainer_throughput: no CIFAR-100 in {data_dir}")
        forensics = forensics_overhead(args, data_dir, Path(tmp)) if args.forensics_repeats > 0 else None
        if args.forensics_only:
            print_forensics(forensics)
            if args.json:
                print(json.dumps({"forensics": forensics}))
            return 0
        ours, runs, seed, rounds = side_by_side(args, data_dir, Path(tmp))
    what = runs[args.precisions[0]]["gpu_model"] or f"CPU, {torch.get_num_threads()} threads"
    cpu_model = runs[args.precisions[0]]["cpu_model"]
    print(f"trainer_throughput: {args.device} ({what}, {cpu_model}), width scale {args.width_scale:g}, "
          f"batch {args.batch_size}, {args.train_images} train images, {args.epochs} epochs "
          f"each (first excluded), median of {args.rounds} alternating round(s)")
    for requested in args.precisions:
        run = runs[requested]
        print(f"  ours {run['precision']:<4} (ddp-train --precision {requested}: uint8 tensor on device, batched "
              f"augment) : {ours[requested]:10,.1f} images/s, {ours[requested] / seed:.2f}x seed")
    if args.device == "cpu":
        auto = choose_precision("auto", "cpu", False, read_cpu_bf16(os.environ))
        print(f"  (--precision auto on this CPU: {auto.name}; {auto.reason})")
    print(f"  seed (torchvision + DataLoader, {args.workers} workers, per-image) : {seed:10,.1f} images/s")
    if len(args.precisions) > 1:
        first, last = args.precisions[0], args.precisions[-1]
        # Each round's own ratio, then their median: a round shares its load between the two sides.
        paired = statistics.median(b / a for a, b in zip(rounds[first], rounds[last]))
        print(f"  ours {runs[last]['precision']}/{runs[first]['precision']}: {ours[last] / ours[first]:.2f}x "
              f"(median of each round's ratio: {paired:.2f}x)")
    print_forensics(forensics)
    if args.json:
        default = ours[args.precisions[-1]]
        print(json.dumps({"device": args.device, "model": what, "width_scale": args.width_scale,
                          "batch_size": args.batch_size, "ours_images_per_s": default,
                          "ours_by_precision": {runs[p]["precision"]: ours[p] for p in args.precisions},
                          "seed_images_per_s": seed, "ratio": default / seed, "rounds": rounds,
                          "forensics": forensics}))
    return 0


def side_by_side(args: argparse.Namespace, data_dir: Path, tmp: Path) -> tuple[dict, dict, float, dict]:
    """Every precision of ours and the seed, --rounds times in alternating order: (ours' median
    images/s by requested precision, ours' run records, the seed's median images/s, every round's
    images/s by side)."""
    sides = [*args.precisions, "seed"]
    rates: dict[str, list[float]] = {side: [] for side in sides}
    runs: dict[str, dict] = {}
    for i in range(args.rounds):
        for side in (sides if i % 2 == 0 else sides[::-1]):
            if side == "seed":
                rates[side].append(run_seed_pipeline(args, data_dir))
            else:
                rate, runs[side] = run_ours(args, data_dir, tmp / f"run-{side}-{i}", side)
                rates[side].append(rate)
            # As each side finishes, so that a run cut off early keeps its figures.
            print(f"  round {i + 1}: {side} {rates[side][-1]:,.1f} images/s", file=sys.stderr, flush=True)
    ours = {p: statistics.median(rates[p]) for p in args.precisions}
    return ours, runs, statistics.median(rates["seed"]), rates


def print_forensics(f: dict | None) -> None:
    if f:
        print(f"  forensics on  (heartbeat, step clock, comm hook; 2 gloo workers) : "
              f"{f['on_images_per_s']:10,.1f} images/s")
        print(f"  forensics off (DDP_FORENSICS=0)                                 : "
              f"{f['off_images_per_s']:10,.1f} images/s")
        print(f"  on/off: {f['on_off_ratio']:.4f} (median of {f['pairs']} interleaved pairs); marks alone "
              f"{f['marks_us_per_step']:.1f} us per step = {f['marks_share']:.4%} of a {f['step_ms']:.1f} ms step")


if __name__ == "__main__":
    sys.exit(main())
