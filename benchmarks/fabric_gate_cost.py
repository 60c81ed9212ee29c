"""What the fabric gate costs: `python -m ddp_train.gate` under torchrun on this machine (gloo on CPU).

Runs the gate REPEAT times with NPROC local ranks and prints, per run, the gate's own time (from
gate.json: rendezvous done to verdict) and the wall time of the whole launch (interpreter and torch
import, rendezvous, the all-reduces); then both medians. On a cluster the job script adds the same
launch once more (an srun step); the figures per size are in gate.txt.
Usage: python benchmarks/fabric_gate_cost.py [--nproc 4] [--repeat 3] [--sizes 65536,1048576,4194304]
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
