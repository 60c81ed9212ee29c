"""A training script in the style of the plain-Ethernet cluster guides written for srun: its rank, world and
local rank from SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, and MASTER_ADDR and MASTER_PORT set by
itself, the first node of the job step and a fixed port.

    sbatch --nodes=2 slurm/ethernet-nccl.sh --script examples/slurm_ranks.py --steps 40

Under ddp-launch it runs unchanged whether SLURM starts one task per GPU or one torchrun per node: in a
torchrun worker SLURM's task variables are the worker's own (SLURM_PROCID is its RANK), and the MASTER_ADDR
it sets is checked against the node where rank 0 runs (docs/own-script.md, "Ranks").
"""

import argparse
import os
import re
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def first_node(nodelist: str) -> str:
    """The first host of a SLURM node list: "node[01-05],gpu7" -> "node01" (what `scontrol show hostnames`
    prints first)."""
    found = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if found is None:
        raise SystemExit(f"cannot read the node list {nodelist!r}")
    prefix, ranges = found.groups()
    return prefix + ranges.split(",")[0].split("-")[0] if ranges else prefix


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--master-port", default="29500")
args = parser.parse_args()

rank = int(os.environ["SLURM_PROCID"])
world_size = int(os.environ["SLURM_NTASKS"])
local_rank = int(os.environ["SLURM_LOCALID"])
os.environ["MASTER_ADDR"] = first_node(os.environ.get("SLURM_STEP_NODELIST") or os.environ["SLURM_JOB_NODELIST"])
os.environ["MASTER_PORT"] = args.master_port

if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
else:
    device = torch.device("cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)

places = [None] * world_size
dist.all_gather_object(places, (rank, local_rank, socket.gethostname()))
if rank == 0:
    print(f"ranks {[place[0] for place in places]} of {world_size} (SLURM_NTASKS), local ranks "
          f"{[place[1] for place in places]} (SLURM_LOCALID), MASTER_ADDR={os.environ['MASTER_ADDR']}", flush=True)

torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(16, 1).to(device), device_ids=[local_rank] if device.type == "cuda" else None)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(rank)
for step in range(args.steps):
    inputs = torch.randn(args.batch_size, 16, generator=generator).to(device)
    loss = (model(inputs) - inputs.sum(dim=1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if rank == 0:
    print(f"done: {args.steps} steps, loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
