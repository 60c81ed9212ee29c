"""Repeat short 2-"node" CPU training runs under load and count how many exit 0.

    .venv/bin/python benchmarks/exit_repeat.py [--runs 10] [--burners 2] [--src DIR]

Each run starts two torchrun agents on 127.0.0.1 (c10d rendezvous, 2 CPU workers each, so
a world of 4 over 2 "nodes", as the e2e cluster runs slurm/olivia-multinode.sh) training a
tiny model for one epoch, while `--burners` busy-loop processes load the CPUs. A finished
run must end with both agents at exit 0; the script prints how many did, and for the
others each agent's code and the last lines of its output (a worker's SIGABRT at exit,
"terminate called without an active exception", shows there). --src runs another copy
of the trainer's sources (e.g. `git archive HEAD src` unpacked) for a before/after figure.

--script PATH runs a user's script instead (examples/env_ranks.py: DDP on gloo, destroy_process_group
at its end), each run twice side by side: as torchrun runs it (`torchrun PATH`) and as ddp-launch runs
it (`torchrun -m ddp_launch.worker PATH`, which leaves past the interpreter's finalization).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAINER_ARGS = ["--allow-unverified-data", "--width-scale", "0.0625", "--epochs", "1",
                "--batch-size", "32", "--limit-train", "128", "--limit-test", "64",
                "--no-tta", "--checkpoint-every", "0"]
BURN = "while True: pass"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer(data_dir: Path, run_dir: Path) -> list[str]:
    return ["-m", "ddp_train", "--data-dir", str(data_dir), "--run-dir", str(run_dir), *TRAINER_ARGS]


def agent_command(port: int, run_id: str, workload: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
            "--max-restarts=0", *workload]


def one_run(name: str, workload: list[str], work: Path, env: dict[str, str],
            timeout_s: float) -> tuple[list[int], list[str]]:
    port = free_port()
    agents = []
    for node in range(2):
        log = open(work / f"{name}-node{node}.log", "w+")
        agents.append((subprocess.Popen(agent_command(port, f"{name}-{port}", workload),
                                        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work), log))
    codes, tails = [], []
    deadline = time.monotonic() + timeout_s
    for proc, log in agents:
        try:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        log.seek(0)
        tails.append("".join(log.readlines()[-6:]))
        log.close()
    return codes, tails


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--burners", type=int, default=2, help="busy-loop processes for load (default 2)")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="trainer sources to run")
    parser.add_argument("--script", type=Path, help="a user's script to run instead of the trainer, "
                                                     "bare and through ddp_launch.worker")
    parser.add_argument("--script-args", default="--steps 200", help="its arguments (default %(default)s)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per run")
    args = parser.parse_args()

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(args.src.resolve()), str(REPO / "entrypoints")]))
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
    passed: dict[str, int] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="exit-repeat-") as tmp:
            work = Path(tmp)
            if args.script:
                script = [str(args.script.resolve()), *args.script_args.split()]
                ways = {"torchrun SCRIPT": script, "torchrun -m ddp_launch.worker SCRIPT":
                        ["-m", "ddp_launch.worker", *script]}
            else:
                subprocess.run([sys.executable, "-m", "ddp_train.synthetic", str(work / "data"),
                                "--train", "128", "--test", "64"], env=env, check=True)
                ways = {f"trainer ({args.src})": None}
            passed = dict.fromkeys(ways, 0)
            for index in range(args.runs):
                for way_index, (way, workload) in enumerate(ways.items()):
                    workload = workload or trainer(work / "data", work / f"run-{index}")
                    started = time.monotonic()
                    codes, tails = one_run(f"run-{index}-{way_index}", workload, work, env, args.timeout_s)
                    ok = codes == [0, 0]
                    passed[way] += ok
                    print(f"run {index + 1}/{args.runs}, {way}: agent exit codes {codes} "
                          f"({time.monotonic() - started:.1f} s){'' if ok else ' FAILED'}", flush=True)
                    if not ok:
                        for node, tail in enumerate(tails):
                            print(f"  node{node} last lines:\n    " + tail.rstrip().replace("\n", "\n    "))
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for way, ok in passed.items():
        print(f"{way}: {ok}/{args.runs} runs exited 0 (2 agents x 2 CPU workers, {args.burners} CPU burners)")
    return 0 if all(ok == args.runs for ok in passed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
