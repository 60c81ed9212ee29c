"""Rank, world and process group from torchrun/env:// variables; small collective helpers.

With no RANK/WORLD_SIZE in the environment the run is a world of 1 and no process group
is created; the helpers below then do nothing, so the loop reads the same either way.
"""

from __future__ import annotations

import datetime
import hashlib
import platform
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist
from ddp_contract import EXPECT_FABRIC_VAR, TASK_DEVICE_VAR
from ddp_contract.nccl_log import check_nccl_transport

from ddp_train import console
from ddp_train.errors import Seen, TrainError

# torchrun sets all of these; a scheduler task launch (srun, one task per GPU) must too.
ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    task_device: Optional[int] = None   # DDP_TASK_DEVICE: its own GPU among those it sees (SLURM bound one)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "DistEnv":
        if "RANK" not in env and "WORLD_SIZE" not in env:
            return cls()

        def number(name: str, default: Optional[int] = None) -> int:
            raw = env.get(name)
            if raw is None:
                if default is None:
                    raise TrainError(f"{name} is not set but RANK/WORLD_SIZE are: start the trainer "
                                     f"with ddp-launch or torchrun, which set all of {', '.join(ENV_VARS)}")
                return default
            try:
                return int(raw)
            except ValueError:
                raise TrainError(f"{name}={raw!r} is not an integer") from None

        world = number("WORLD_SIZE")
        rank = number("RANK")
        local_rank = number("LOCAL_RANK", 0)
        local_world = number("LOCAL_WORLD_SIZE", world)
        if world < 1 or not 0 <= rank < world or not 0 <= local_rank < local_world:
            raise TrainError(f"inconsistent ranks: RANK={rank} WORLD_SIZE={world} "
                             f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world}")
        if world > 1:
            for name in ("MASTER_ADDR", "MASTER_PORT"):
                if not env.get(name):
                    raise TrainError(f"{name} is not set for a world of {world}: "
                                     f"start the trainer with ddp-launch or torchrun")
            port = number("MASTER_PORT")
            if not 0 < port < 65536:
                raise TrainError(f"MASTER_PORT={port} is not a TCP port (1..65535)")
        raw_device = env.get(TASK_DEVICE_VAR)
        task_device = number(TASK_DEVICE_VAR) if raw_device is not None else None
        if task_device is not None and task_device < 0:
            raise TrainError(f"{TASK_DEVICE_VAR}={raw_device!r} is not a device index (0, 1, ...)")
        return cls(rank, world, local_rank, local_world, task_device)


def gpu_index(dist_env: DistEnv, visible: int) -> int:
    """This process's GPU among the `visible` it sees: one per local rank, never shared (NCCL refuses
    two ranks on one GPU with a "Duplicate GPU detected" traceback, so the mistake is named here instead).

    A task bound to its own GPU (SLURM --gpus-per-task=1) sees that one alone; LOCAL_RANK keeps
    torch's meaning (its index on the node), so ddp-launch's slurm-task mode names the task's GPU
    in DDP_TASK_DEVICE instead. Every rank of a node sees the same GPUs: local rank 0 tells (errors.Seen).
    """
    if dist_env.task_device is not None:
        if dist_env.task_device >= visible:
            raise TrainError(f"{TASK_DEVICE_VAR}={dist_env.task_device} but this task sees {visible} GPU(s): "
                             f"start it with ddp-launch inside the srun step that bound its GPU", Seen.BY_EVERY_RANK_OF_NODE)
        return dist_env.task_device
    if dist_env.local_world_size > visible:
        raise TrainError(
            f"{dist_env.local_world_size} processes on this node (LOCAL_WORLD_SIZE) but only {visible} "
            f"GPU(s) visible: start one process per GPU (--nproc-per-node {visible}), or pass "
            f"--device cpu for CPU workers", Seen.BY_EVERY_RANK_OF_NODE)
    return dist_env.local_rank


def pick_device(requested: str, dist_env: DistEnv) -> torch.device:
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise TrainError("--device cuda but no CUDA GPU is visible (check --nv / --gpus)", Seen.BY_EVERY_RANK_OF_NODE)
        index = gpu_index(dist_env, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_process_group(dist_env: DistEnv, device: torch.device, timeout_s: float, backend: str) -> None:
    """backend: resolve.resolve_backend's answer (nccl, or gloo on CPU or CUDA tensors)."""
    if dist_env.world_size == 1:
        return
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        kwargs["device_id"] = device  # eager NCCL init: the first collective is not slow
    dist.init_process_group(backend=backend, init_method="env://", rank=dist_env.rank,
                            world_size=dist_env.world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest of every rank's value, on every rank (one tiny all-reduce)."""
    t = torch.tensor([value], dtype=torch.int32, device=device if active() else "cpu")
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class DelayedMax:
    """The max of every rank's small integer, launched now and read one check later.

    A blocking all-reduce plus .item() makes the host wait for every queued kernel. Here the
    all-reduce is asynchronous and its result is copied to pinned host memory behind an event;
    read() comes one check later (stop_check_every steps), when that event is long past, so the
    host does not wait in practice. Every rank reads the same vote at the same step, so every
    rank decides the same.
    """

    def __init__(self, device: torch.device):
        self.device = device if active() else torch.device("cpu")
        cuda = self.device.type == "cuda"
        self.host = torch.zeros(1, dtype=torch.int32, pin_memory=cuda)
        self.pending: Optional[tuple[Any, Any, torch.Tensor]] = None

    def launch(self, value: int) -> None:
        """Start the vote (dropping an unread one: it is never needed once a newer one starts)."""
        vote = torch.full((1,), value, dtype=torch.int32, device=self.device)  # a fill, no copy
        work = dist.all_reduce(vote, op=dist.ReduceOp.MAX, async_op=True) if active() else None
        event = None
        if self.device.type == "cuda":
            if work is not None:
                work.wait()  # NCCL: orders the current stream after the all-reduce; the host goes on
                work = None
            self.host.copy_(vote, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        self.pending = (work, event, vote)

    def read(self) -> int:
        """The vote launched last (0 when none is pending); then nothing is pending."""
        if self.pending is None:
            return 0
        work, event, vote = self.pending
        self.pending = None
        if event is not None:
            event.synchronize()
            return int(self.host[0])
        if work is not None:
            work.wait()
        return int(vote[0])


def barrier() -> None:
    if active():
        dist.barrier()


def all_gather_objects(obj: Any) -> list[Any]:
    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agree_or_raise(error: Optional[TrainError], device: torch.device) -> None:
    """Make a setup error on one rank an error on every rank, instead of peers hanging.

    The lowest rank that found an error reports it (whatever rank that is: a corrupt file
    may sit on one node only); every other rank exits quietly with the same code.
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if active() else (0, 1)
    # The max of (world - rank) over the failing ranks names the lowest of them.
    reporter = world - max_over_ranks(world - rank if error is not None else 0, device)
    if reporter == world:
        return
    if error is not None and rank == reporter:
        error.seen = Seen.BY_THIS_RANK
        raise error
    raise TrainError(f"setup failed on rank {reporter} (its log says why)", Seen.ELSEWHERE)


def count_nodes() -> tuple[int, int]:
    """(nodes, processes on the busiest node) from every rank's hostname."""
    hosts = all_gather_objects(socket.gethostname())
    per_host: dict[str, int] = {}
    for h in hosts:
        per_host[h] = per_host.get(h, 0) + 1
    return len(per_host), max(per_host.values())


def average_buffers(module: torch.nn.Module) -> None:
    """BatchNorm running stats drift apart per rank; average them so every rank evaluates alike."""
    if not active():
        return
    world = dist.get_world_size()
    for buf in module.buffers():
        if buf.is_floating_point():
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            buf.div_(world)


def check_network_transport(env: Mapping[str, str], device: torch.device,
                            backend: str = "nccl") -> Optional[str]:
    """Which network NCCL chose, read from its log after the first collective.

    On Slingshot or InfiniBand a fallback to TCP sockets fails nothing and makes
    the all-reduce ~20x slower, so it must never pass silently: returns this
    rank's message (a loud warning on a sockets fallback), and under
    --require-fabric (DDP_REQUIRE_FABRIC=1) raises on every rank when any rank
    fell back. The launcher sets DDP_EXPECT_FABRIC and the NCCL log file.
    """
    if device.type != "cuda" or backend != "nccl" or not env.get(EXPECT_FABRIC_VAR):
        return None  # gloo on GPUs writes no NCCL log: there is no NCCL choice to check
    ok, message = check_nccl_transport(env)
    agree_or_raise(None if ok else TrainError(message), device)  # the first failing rank prints
    return message


def announce_network_transport(env: Mapping[str, str], device: torch.device, local_rank: int,
                               backend: str = "nccl") -> None:
    """check_network_transport, its message on stderr once per node (local rank 0), not per GPU."""
    message = check_network_transport(env, device, backend)
    if message and local_rank == 0:
        console.warn(f"[{socket.gethostname()}] {message}")


@dataclass(frozen=True)
class World:
    """What the run spans, as its "run" record and its summary describe it."""
    size: int
    nodes: int
    processes_per_node: int  # on the busiest node
    device: str  # "cuda" or "cpu"
    gpu_model: Optional[str]
    cpu_model: str
    threads_per_process: int
    versions: dict[str, Optional[str]]

    @property
    def gpus_per_node(self) -> int:
        return self.processes_per_node if self.device == "cuda" else 0


def versions(device: torch.device) -> dict[str, Optional[str]]:
    cuda = device.type == "cuda"
    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": str(torch.backends.cudnn.version()) if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
    }


def describe_world(dist_env: DistEnv, device: torch.device) -> World:
    """The world from every rank's hostname (a collective) and this rank's device and software."""
    nodes, per_node = count_nodes()
    return World(
        size=dist_env.world_size, nodes=nodes, processes_per_node=per_node,
        device=device.type, gpu_model=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        cpu_model=platform.processor() or platform.machine(), threads_per_process=torch.get_num_threads(),
        versions=versions(device))


def parameter_digest(model: torch.nn.Module) -> str:
    """A hash of the exact parameter bits: equal on every rank when DDP kept them in sync."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def parameter_digests(model: torch.nn.Module) -> list[str]:
    """Every rank's parameter_digest, on every rank (a collective)."""
    return all_gather_objects(parameter_digest(model))
