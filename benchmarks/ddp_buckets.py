"""DDP's gradient buckets for the full WideResNet, as its reducer really fires them: order, size,
and which layers each holds. Two gloo ranks on this machine; the layout is the same under NCCL.

    python benchmarks/ddp_buckets.py                   # the trainer's default, 25 MB buckets
    python benchmarks/ddp_buckets.py --bucket-cap-mb 50

A recording comm hook sees every bucket of the second backward (after DDP rebuilt its buckets
in gradient-ready order on the first) in the order the all-reduces are launched.
"""

import argparse
import json
import os
import socket
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ddp_train.recipe.model import WideResNet
from ddp_train.fast.speed import wrap_ddp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record_buckets(rank: int, world: int, port: int, width: float, cap_mb: float, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = WideResNet(100, width)
    names = {id(p): n for n, p in model.named_parameters()}
    ddp = wrap_ddp(model, torch.device("cpu"), cap_mb, "none")
    fired: list[dict[str, Any]] = []

    def recording_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        # (DDP checks these annotations as objects, hence no `from __future__ import annotations`.)
        params = bucket.parameters()
        fired.append({"index": bucket.index(), "bytes": bucket.buffer().numel() * bucket.buffer().element_size(),
                      "first": names[id(params[0])], "last": names[id(params[-1])], "params": len(params)})
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, recording_hook)
    # 8x8, not CIFAR's 32x32: the buckets follow the parameters, not the activations, and the model's two
    # max-pools and global pool take any size down to 4x4; 16x less compute for the same record.
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        fired.clear()
        ddp(x).sum().backward()
    if rank == 0:
        out.put({"fired": fired, "logging": {k: v for k, v in ddp._get_ddp_logging_data().items()
                                             if "bucket" in k}})
    dist.barrier()
    dist.destroy_process_group()


def buckets(width: float = 1.0, cap_mb: float = 25.0, world: int = 2) -> dict[str, Any]:
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.spawn(record_buckets, args=(world, free_port(), width, cap_mb, queue), nprocs=world, join=True)
    return queue.get()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width-scale", type=float, default=1.0)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--json", action="store_true", help="print the record as one JSON line")
    args = p.parse_args()
    torch.set_num_threads(1)
    found = buckets(args.width_scale, args.bucket_cap_mb)
    if args.json:
        print(json.dumps(found))
        return 0
    fired = found["fired"]
    total = sum(b["bytes"] for b in fired)
    print(f"ddp_buckets: width {args.width_scale:g}, bucket_cap_mb {args.bucket_cap_mb:g}, "
          f"{total / 1e6:.2f} MB of fp32 gradients in {len(fired)} buckets, in all-reduce launch order:")
    for order, b in enumerate(fired):
        print(f"  {order}: bucket {b['index']}, {b['bytes'] / 1e6:6.2f} MB, {b['params']:2d} tensors, "
              f"{b['first']} .. {b['last']}")
    print(f"  reducer: {found['logging']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
