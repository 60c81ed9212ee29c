"""A training script in the style of the cluster guides that launch with torchrun (Sigma2's train_ddp.py):
strict argparse, its place in the world from torchrun's variables, and taking part in ddp-launch's contract.

    sbatch slurm/olivia-1gpu.sh --script examples/argparse_torchrun.py --steps 60
    ddp-launch --mode local --cpu-workers 2 --script examples/argparse_torchrun.py -- --steps 60

The contract's part (docs/own-script.md), in a few lines marked `ddp.`: its checkpoint goes to the run
dir the job gives it (DDP_RUN_DIR), it resumes from it, it names a rank that hangs (progress, watch), and it
stops on the time limit's USR2 (or TERM) by writing the checkpoint and exiting 75, which the job script
answers with a requeue. A toy: a small network learns a fixed random map on random inputs.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ddp_contract import workload as ddp


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per rank and step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--width", type=int, default=256, help="the hidden layer's width")
    parser.add_argument("--run-dir", default=None, help="where the checkpoint goes (default: DDP_RUN_DIR)")
    return parser.parse_args()  # strict: an argument it does not know is an error, exit 2


def save(path: Path, state: dict) -> None:
    """Written aside and renamed: a stop or a crash mid-write never leaves half a checkpoint."""
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def main() -> int:
    args = parse_args()
    run_dir = Path(args.run_dir or ddp.run_dir() or "runs/example")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same model and target on every rank
    target = torch.nn.Linear(32, 4).to(device)
    model = torch.nn.Sequential(torch.nn.Linear(32, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    checkpoint = run_dir / "example-checkpoint.pt"
    start = 0
    if checkpoint.exists():
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["next_step"]
        if rank == 0:
            print(f"resumed at step {start} from {checkpoint}", flush=True)
    elif ddp.resuming() and rank == 0:
        print(f"warning: this run continues an earlier one, but {checkpoint} is not there: starting at step 0",
              flush=True)
    ddp_model = ddp.watch(DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None))
    if rank == 0:
        print(f"world size {world}, backend {backend}, steps {start}-{args.steps - 1}", flush=True)

    generator = torch.Generator().manual_seed(1000 * rank + start)
    loss = torch.zeros(())
    for step in range(start, args.steps):
        ddp.progress(step)
        inputs = torch.randn(args.batch_size, 32, generator=generator).to(device)
        with torch.no_grad():
            wanted = target(inputs)
        loss = torch.nn.functional.mse_loss(ddp_model(inputs), wanted)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        stop = ddp.stop_requested()  # every rank, every step: they agree on it
        if stop or step % 20 == 19:
            if rank == 0:
                run_dir.mkdir(parents=True, exist_ok=True)
                save(checkpoint, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                  "next_step": step + 1})
            dist.barrier()
        if stop:
            if rank == 0:
                print(f"stop requested ({stop}) at step {step}: checkpoint {checkpoint} written, exit "
                      f"{ddp.EXIT_REQUEUE} to be requeued", flush=True)
            dist.destroy_process_group()
            return ddp.EXIT_REQUEUE
        if rank == 0 and step % 20 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
