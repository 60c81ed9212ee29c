"""A rank's CPU-seconds from a new process to its first optimizer step: torch.optim.SGD against
EagerSGD (ddp_train/recipe/eager_sgd.py), the trainer's optimizer, which takes the same steps without
importing torch._dynamo.

    python benchmarks/rank_setup.py            # 5 rounds
    python benchmarks/rank_setup.py --rounds 9

Each round starts one fresh process per optimizer, alternately, so a busy machine slows both alike.
A process imports torch, builds the trainer's model (WideResNet at the e2e jobs' width 1/8) and the
optimizer as the trainer does (momentum 0.9, Nesterov, weight decay, foreach on the CPU), takes one
forward, backward and step on a batch of 8, and reports its own CPU time (time.process_time: every
thread) at each point. Printed: the median of each part and the whole, per optimizer, and their
ratio. On a GPU node the step differs (fused SGD, CUDA's start-up) but the import does not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

OPTIMIZERS = ("torch.optim.SGD", "EagerSGD")  # as the child process names them

CHILD = """
import json, sys, time
started = time.process_time()
import torch
imported = time.process_time()
from ddp_train.recipe.eager_sgd import EagerSGD
from ddp_train.recipe.model import WideResNet
torch.manual_seed(0)
model = WideResNet(100, 0.125, 0.0)
optimizer_class = {optimizer}
optimizer = optimizer_class(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
built = time.process_time()
model(torch.randn(8, 3, 32, 32)).logsumexp(1).mean().backward()
optimizer.step()
stepped = time.process_time()
print(json.dumps({{"import torch": imported - started, "model and optimizer": built - imported,
                  "first step": stepped - built, "whole": stepped - started,
                  "torch._dynamo imported": "torch._dynamo" in sys.modules}}))
"""


def one_process(optimizer: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD.format(optimizer=optimizer)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"rank_setup: the {optimizer} process failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes per optimizer (default 5)")
    args = parser.parse_args()

    one_process("EagerSGD")  # the page cache and .pyc files, for both
    runs: dict[str, list[dict]] = {name: [] for name in OPTIMIZERS}
    for _ in range(args.rounds):
        for name in OPTIMIZERS:
            runs[name].append(one_process(name))

    parts = ("import torch", "model and optimizer", "first step", "whole")
    print(f"rounds (interleaved, fresh processes): {args.rounds}; CPU-seconds, median")
    print(f"{'':22}" + "".join(f"{part:>22}" for part in parts) + "  torch._dynamo")
    medians = {}
    for name, results in runs.items():
        medians[name] = {part: statistics.median(result[part] for result in results) for part in parts}
        dynamo = "imported" if all(result["torch._dynamo imported"] for result in results) else \
            "not imported" if not any(result["torch._dynamo imported"] for result in results) else "sometimes"
        print(f"{name:22}" + "".join(f"{medians[name][part]:22.2f}" for part in parts) + f"  {dynamo}")
    before, after = medians["torch.optim.SGD"]["whole"], medians["EagerSGD"]["whole"]
    print(f"EagerSGD's rank: {after / before:.2f}x the CPU-seconds of torch.optim.SGD's "
          f"({before - after:.2f} CPU-s less; import torch alone: {medians['EagerSGD']['import torch']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
