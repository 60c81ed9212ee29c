"""Launcher start-up cost: `python -m ddp_launch --dry-run` against a bare `python -c pass`.

Both run interleaved in one process, so load on the machine hits both alike;
prints both medians and their ratio (targets: under 100 ms on the development machine,
under 3x a bare interpreter start).
The launcher sees a 2-node, 4-GPU SLURM step (the Olivia guide's multi-node job) whose head is
this machine's own name, so its one name lookup is answered locally. Its 4 workers
per node are CPU workers: with GPUs granted the launcher would also ask the CUDA
driver (cuInit) whether they are usable, and this machine has no GPU to answer.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

TARGET_RATIO = 3.0
TARGET_MS = 100.0


def slurm_fixture() -> dict[str, str]:
    head = socket.gethostname()
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NODELIST": f"{head},olivia-peer",
        "SLURM_STEP_NODELIST": f"{head},olivia-peer",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": head,
        "DDP_LAUNCH_CPU_WORKERS": "4",
    }


def time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode().strip()}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each command (default 40)")
    args = parser.parse_args()

    env = slurm_fixture()
    bare = [sys.executable, "-c", "pass"]
    launcher = [sys.executable, "-m", "ddp_launch", "--dry-run"]
    for argv in (bare, launcher):  # warm the page cache and .pyc files
        time_once(argv, env)
    bare_s, launcher_s = [], []
    for _ in range(args.runs):
        bare_s.append(time_once(bare, env))
        launcher_s.append(time_once(launcher, env))

    bare_ms = statistics.median(bare_s) * 1000
    launcher_ms = statistics.median(launcher_s) * 1000
    ratio = launcher_ms / bare_ms
    print(f"runs (interleaved)             {args.runs}")
    print(f"python -c pass                 {bare_ms:7.1f} ms (median)")
    within_ms = "within" if launcher_ms < TARGET_MS else "OVER"
    print(f"python -m ddp_launch --dry-run {launcher_ms:7.1f} ms (median, {within_ms} the {TARGET_MS:g} ms target)")
    verdict = "within" if ratio < TARGET_RATIO else "OVER"
    print(f"ratio                          {ratio:7.2f}x  ({verdict} the {TARGET_RATIO:g}x target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
