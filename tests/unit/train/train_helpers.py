"""Run the real `python -m ddp_train` (or torchrun) in a subprocess with a clean environment."""

from __future__ import annotations

import os
import subprocess
import sys

# What a launcher sets for a rank.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

# Tiny and fast: a 1/16-width model on a few hundred images. These runs mean CPU (gloo ranks
# on one machine): on a GPU machine every rank would otherwise pick the one GPU.
TINY_ARGS = ["--width-scale", "0.0625", "--allow-unverified-data", "--batch-size", "32", "--device", "cpu"]


def trainer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in (*LAUNCH_VARIABLES,
                        # torch writes its /tmp default here when a test in this process creates an
                        # optimizer; inherited, it would outrank <run-dir>/compile-cache.
                        "TORCHINDUCTOR_CACHE_DIR")}
    # CUDA_VISIBLE_DEVICES="": the trainer tests mean CPU, also where a GPU is present.
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="", **extra)
    return env


# A few seconds alone, but `make test` runs the unit suite beside the e2e clusters' training on 2 cores,
# where one 3-epoch run passed 120 s.
TRAINER_TIMEOUT_S = 400


def run_trainer(args: list[str], timeout: float = TRAINER_TIMEOUT_S, torchrun_nproc: int = 0,
                env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    if torchrun_nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={torchrun_nproc}", "-m", "ddp_train", *args]
    else:
        cmd = [sys.executable, "-m", "ddp_train", *args]
    return subprocess.run(cmd, env=trainer_env(**(env_extra or {})), capture_output=True, text=True, timeout=timeout)
