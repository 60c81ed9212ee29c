"""What the fabric gate costs: `python -m ddp_train.gate` under torchrun on this machine (gloo on CPU).

Runs the gate REPEAT times with NPROC local ranks and prints, per run, the gate's own time (from
gate.json: rendezvous done to verdict) and the wall time of the whole launch (interpreter and torch
import, rendezvous, the all-reduces); then both medians. The figures per size are in gate.txt.

Then a job's start both ways, side by side in each repeat: the gate as a step of its own followed by a
short training (two launches: what a user's script gets), against one training whose ranks run the gate
first (`ddp-train --fabric-gate`: what the job scripts run for the built-in trainer). It prints the wall
time and the CPU-seconds of each (the launches' processes, torchrun's workers included) and their ratios.
Usage: python benchmarks/fabric_gate_cost.py [--nproc 4] [--repeat 3] [--sizes 65536,1048576,4194304]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(nproc: int, sizes: str | None, port: int) -> tuple[float, float, dict]:
    with tempfile.TemporaryDirectory() as run_dir:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-port", str(port), "-m", "ddp_train.gate", "--device", "cpu", "--run-dir", run_dir]
        if sizes:
            argv += ["--sizes", sizes]
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'entrypoints'}{os.pathsep}{REPO / 'src'}", "OMP_NUM_THREADS": "1"}
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"gate run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        report = json.loads((Path(run_dir) / "gate.json").read_text())
        return report["seconds"], wall, report


# A short training on generated data (--demo without CIFAR-100): one epoch of a few steps, so the launch
# and the gate are what differs between the two ways.
TRAINING = ["-m", "ddp_train", "--demo", "--device", "cpu", "--epochs", "1", "--limit-train", "512",
            "--limit-test", "128"]


def launched(nproc: int, port: int, module_args: list[str]) -> tuple[float, float]:
    """(wall s, CPU-s) of one torchrun launch; its workers' CPU comes back through torchrun's waits."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
            str(port), *module_args]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'entrypoints'}{os.pathsep}{REPO / 'src'}", "OMP_NUM_THREADS": "1"}
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(module_args[:2])} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def job_start_both_ways(nproc: int, port: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """((wall, CPU) with the gate's own step, (wall, CPU) with the gate in the trainer's ranks)."""
    with tempfile.TemporaryDirectory() as base:
        data = os.path.join(base, "no-data")
        gate_step = launched(nproc, port, ["-m", "ddp_train.gate", "--device", "cpu", "--run-dir", base + "/a"])
        training = launched(nproc, port + 1, [*TRAINING, "--data-dir", data, "--run-dir", base + "/a"])
        in_trainer = launched(nproc, port + 2, [*TRAINING, "--data-dir", data, "--run-dir", base + "/b",
                                                "--fabric-gate"])
        if not json.loads((Path(base) / "b" / "gate.json").read_text())["ok"]:
            sys.exit("the trainer's gate did not pass")
    return (gate_step[0] + training[0], gate_step[1] + training[1]), in_trainer


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes")
    args = parser.parse_args()
    gate_s, wall_s = [], []
    for index in range(args.repeat):
        seconds, wall, report = one_run(args.nproc, args.sizes, 29600 + index)
        gate_s.append(seconds)
        wall_s.append(wall)
        largest = max(report["world"]["sizes"], key=lambda s: s["size_bytes"])
        print(f"run {index + 1}: gate {seconds:.2f} s, launch wall {wall:.2f} s, "
              f"busbw {largest['busbw_gbps']:.3f} GB/s at {largest['size_bytes']} B, {report['verdict']}")
    print(f"median over {args.repeat}: gate {statistics.median(gate_s):.2f} s, "
          f"launch wall {statistics.median(wall_s):.2f} s ({args.nproc} gloo ranks on this machine)")
    ratios = []
    for index in range(args.repeat):
        (step_wall, step_cpu), (in_wall, in_cpu) = job_start_both_ways(args.nproc, 29700 + 10 * index)
        ratios.append((in_wall / step_wall, in_cpu / step_cpu))
        print(f"job start {index + 1}: gate step + training {step_wall:.1f} s wall, {step_cpu:.1f} CPU-s; "
              f"training with --fabric-gate {in_wall:.1f} s wall, {in_cpu:.1f} CPU-s "
              f"(x{in_wall / step_wall:.2f} wall, x{in_cpu / step_cpu:.2f} CPU)")
    print(f"median over {args.repeat}: the gate in the trainer takes x{statistics.median(r[0] for r in ratios):.2f} "
          f"the wall time and x{statistics.median(r[1] for r in ratios):.2f} the CPU-seconds of a gate step and a "
          f"training ({args.nproc} gloo ranks, a one-epoch --demo training)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
