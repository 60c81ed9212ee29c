"""Smallest DDP workload for the launcher's e2e tests: gloo all-reduce of the ranks.

Every rank prints one line; rank 0 writes {"world_size", "sum", "hosts", ...} as JSON to
the file named by $ALLREDUCE_RESULT (or argv[1]) so a test can assert on it.
"""
import json
import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    print(f"rank {rank}/{world} on {socket.gethostname()}: all-reduce sum {value.item():g}", flush=True)
    result_path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("ALLREDUCE_RESULT")
    if rank == 0 and result_path:
        with open(result_path + ".tmp", "w", encoding="utf-8") as out:
            json.dump({"world_size": world, "sum": value.item(), "hosts": hosts,
                       "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "0")),
                       "under_torchrun": "TORCHELASTIC_RUN_ID" in os.environ}, out)
        os.replace(result_path + ".tmp", result_path)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
