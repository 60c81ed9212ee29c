"""bf16 on the CPU: the step's speed with and without the CPU's bf16 instructions, and the demo's
training run in fp32 and bf16, seed by seed.

    python benchmarks/cpu_bf16.py                    # both parts (minutes: six demo runs)
    python benchmarks/cpu_bf16.py --only step        # the step under oneDNN's ISA caps
    python benchmarks/cpu_bf16.py --only training --seeds 0 --json

step: the trainer's model (ddp_train.recipe.model, --width-scale and --batch-size, default the demo's
1/16 and 128), forward + backward + SGD on one process, fp32 and bf16 autocast in alternating
timed rounds (best of --rounds), as images per second of wall time and per CPU-second of the
process (time.process_time, every thread): on a machine shared with other work the wall figures
follow the load, the CPU ones much less. Each row is a fresh process with ONEDNN_MAX_CPU_ISA set, which
makes oneDNN (torch's CPU convolutions) dispatch as on an older CPU
(https://uxlfoundation.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html): "as found" uses
whatever this CPU has, AVX512_CORE stands for AVX-512 without BF16 (Intel Skylake to Ice Lake),
AVX2 for CPUs without AVX-512 (AMD Zen 2 and 3). On a CPU without AVX512_BF16 every row is emulated.

training: `make demo`'s command (ddp-launch, 2 CPU workers, `--demo`: width 1/16, 2 epochs, 4,000
generated training and 1,000 test images) with `--precision fp32` or `--precision bf16` and `--seed
S`; the seed picks the initial weights, the batch order and the generated data. Seeds run fp32 and
bf16 alternately, so a busy machine slows both sides alike. The tolerance is the seed's own effect:
bf16 trains as well as fp32 when, at the same seed, the two differ by less than fp32 runs of
different seeds differ from each other (equally valid runs of the same recipe). With one seed
there is nothing to compare with, and the differences are printed alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddp_train.metrics import read_metrics

PRECISIONS = ("fp32", "bf16")
# "" leaves oneDNN as found; the others cap it below the bf16 instructions.
ISA_CAPS = ("", "AVX512_CORE", "AVX2")
CURVES = ("train_loss", "val_loss", "val_accuracy")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("step", "training"), help="one part (default: both)")
    p.add_argument("--width-scale", type=float, default=1 / 16, help="step: model width (default: the demo's 1/16)")
    p.add_argument("--batch-size", type=int, default=128, help="step: batch (default: the demo's 128)")
    p.add_argument("--rounds", type=int, default=3, help="step: alternating timed rounds, best kept (default: 3)")
    p.add_argument("--round-s", type=float, default=3.0, help="step: seconds per timed round (default: 3)")
    p.add_argument("--seeds", default="0,1,2", help="training: comma-separated (default: 0,1,2)")
    p.add_argument("--cpu-workers", type=int, default=2, help="training: as make demo (default: 2)")
    p.add_argument("--json", action="store_true", help="also print one JSON line with the figures")
    p.add_argument("--step-worker", action="store_true", help=argparse.SUPPRESS)  # one row, in a child
    args = p.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    return args


# -- step: images/s of the training step, fp32 and bf16, under each ISA cap --

def step_rates(width_scale: float, batch_size: int, rounds: int, round_s: float) -> dict[str, float]:
    """In this process: the best images per wall second and per CPU-second of fp32 and of bf16
    autocast over alternating rounds ({"fp32": .., "bf16": .., "fp32_cpu": .., "bf16_cpu": ..})."""
    import torch
    import torch.nn as nn
    from ddp_train.recipe.model import WideResNet

    torch.manual_seed(0)
    model = WideResNet(100, width_scale, 0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch_size, 3, 32, 32), torch.randint(0, 100, (batch_size,))
    loss_fn = nn.CrossEntropyLoss()

    def step(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for bf16 in (False, True):  # warm-up: oneDNN builds its kernels on first use
        step(bf16)
    best = {f"{precision}{kind}": 0.0 for precision in PRECISIONS for kind in ("", "_cpu")}
    for i in range(rounds):
        for precision in (PRECISIONS if i % 2 == 0 else PRECISIONS[::-1]):
            started, cpu_started, steps = time.perf_counter(), time.process_time(), 0
            while time.perf_counter() - started < round_s:
                step(precision == "bf16")
                steps += 1
            images = steps * batch_size
            best[precision] = max(best[precision], images / (time.perf_counter() - started))
            best[f"{precision}_cpu"] = max(best[f"{precision}_cpu"], images / (time.process_time() - cpu_started))
    return best


def step_under_cap(args: argparse.Namespace, cap: str) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    if cap:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    cmd = [sys.executable, __file__, "--step-worker", "--width-scale", str(args.width_scale),
           "--batch-size", str(args.batch_size), "--rounds", str(args.rounds), "--round-s", str(args.round_s)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def step_part(args: argparse.Namespace) -> dict:
    from ddp_train.precision import read_cpu_bf16
    rows = {}
    print(f"step: width {args.width_scale:g}, batch {args.batch_size}, one process, forward + backward + SGD, "
          f"best of {args.rounds} alternating rounds of {args.round_s:g} s")
    print(f"  {'ONEDNN_MAX_CPU_ISA':<19} {'fp32 img/s':>11} {'bf16 img/s':>11} {'bf16/fp32':>10} "
          f"{'per CPU-s':>10}  auto picks")
    for cap in ISA_CAPS:
        rates = step_under_cap(args, cap)
        auto = read_cpu_bf16({"ONEDNN_MAX_CPU_ISA": cap} if cap else {})
        rows[cap or "as found"] = {**rates, "auto": "bf16" if auto.native else "fp32"}
        print(f"  {cap or '(as found)':<19} {rates['fp32']:>11,.1f} {rates['bf16']:>11,.1f} "
              f"{rates['bf16'] / rates['fp32']:>9.2f}x {rates['bf16_cpu'] / rates['fp32_cpu']:>9.2f}x  "
              f"{'bf16' if auto.native else 'fp32'}")
    return rows


# -- training: the demo in fp32 and bf16, seed by seed --

def demo_run(precision: str, seed: int, workers: int, tmp: Path) -> dict:
    """One `make demo` run; its epochs' losses and accuracy, and its wall time."""
    run_dir = tmp / f"{precision}-{seed}"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", str(workers), "--",
           "--demo", "--data-dir", str(tmp / "no-data"), "--run-dir", str(run_dir),
           "--precision", precision, "--seed", str(seed)]
    started = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    wall_s = time.perf_counter() - started
    records = read_metrics(run_dir / "metrics.jsonl")
    epochs = [r for r in records if r["type"] == "epoch"]
    summary = [r for r in records if r["type"] == "summary"][-1]
    run = next(r for r in records if r["type"] == "run")
    return {"precision": run["precision"], "seed": seed, "wall_s": wall_s, "train_s": summary["total_time_s"],
            **{curve: [e[curve] for e in epochs] for curve in CURVES}}


def largest_difference(a: dict, b: dict, curve: str) -> float:
    return max(abs(x - y) for x, y in zip(a[curve], b[curve]))


def seed_spread(runs: list[dict], curve: str) -> float:
    """The largest difference between two runs of different seeds, epoch by epoch."""
    return max((largest_difference(a, b, curve) for i, a in enumerate(runs) for b in runs[i + 1:]), default=0.0)


def training_part(args: argparse.Namespace) -> tuple[list[dict], bool]:
    runs: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory(prefix="cpu-bf16-") as tmp:
        for index, seed in enumerate(args.seeds):
            for precision in (PRECISIONS if index % 2 == 0 else PRECISIONS[::-1]):
                runs[precision, seed] = demo_run(precision, seed, args.cpu_workers, Path(tmp))
    print(f"training: make demo's run (--demo, {args.cpu_workers} CPU workers) in fp32 and bf16, "
          f"seeds {', '.join(map(str, args.seeds))}")
    print("  seed precision  train loss by epoch   val loss by epoch     val accuracy by epoch  train s  wall s")
    for seed in args.seeds:
        for precision in PRECISIONS:
            r = runs[precision, seed]
            print(f"  {seed:>4} {r['precision']:<9} " + "  ".join(
                " ".join(f"{v:.4f}" for v in r[curve]).ljust(20) for curve in CURVES)
                + f" {r['train_s']:7.1f} {r['wall_s']:7.1f}")
    fp32_runs = [runs["fp32", s] for s in args.seeds]
    verdicts = []
    for curve in CURVES:
        same_seed = max(largest_difference(runs["fp32", s], runs["bf16", s], curve) for s in args.seeds)
        spread = seed_spread(fp32_runs, curve)
        verdicts.append(same_seed < spread)
        verdict = "" if len(args.seeds) < 2 else f": {'agree' if same_seed < spread else 'DIFFER'}"
        print(f"  {curve:<13}: bf16 against fp32 at the same seed, largest difference {same_seed:.4f}; "
              f"fp32 across seeds {spread:.4f}{verdict}")
    for precision in PRECISIONS:
        train_s = sum(runs[precision, s]["train_s"] for s in args.seeds)
        wall_s = sum(runs[precision, s]["wall_s"] for s in args.seeds)
        print(f"  {precision}: {train_s:.1f} s training, {wall_s:.1f} s wall over {len(args.seeds)} run(s)")
    return list(runs.values()), len(args.seeds) < 2 or all(verdicts)


def main() -> int:
    args = parse_args()
    if args.step_worker:
        print(json.dumps(step_rates(args.width_scale, args.batch_size, args.rounds, args.round_s)))
        return 0
    figures: dict = {}
    agree = True
    if args.only in (None, "step"):
        figures["step"] = step_part(args)
    if args.only in (None, "training"):
        figures["training"], agree = training_part(args)
    if args.json:
        print(json.dumps(figures))
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
