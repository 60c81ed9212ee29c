"""A training script in the style of RCP's RunAI guide: its rank, world and local rank read from RANK,
WORLD_SIZE and LOCAL_RANK directly, and handed to init_process_group. It takes no part in ddp-launch's
contract beyond what it reads: the preflight, the fabric gate, the manifest and the Flight Recorder's dump
reach it all the same (docs/own-script.md).

    runai/submit.sh --script /mloscratch/homes/<user>/code/env_ranks.py --steps 40
    sbatch slurm/raven-1node-4gpu.sh --script examples/env_ranks.py --steps 40
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()

rank = int(os.environ["RANK"])
world_size = int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
else:
    device = torch.device("cpu")
dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size)

# Every rank's (rank, local rank, host), in rank order: a duplicate rank would show here.
places = [None] * world_size
dist.all_gather_object(places, (rank, local_rank, socket.gethostname()))
if rank == 0:
    print(f"ranks {[place[0] for place in places]} of {world_size}, local ranks {[place[1] for place in places]}, "
          f"{len({place[2] for place in places})} host(s)", flush=True)

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
