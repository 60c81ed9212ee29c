"""How many workers run on this node, on GPUs or on CPUs, and how many threads each gets.

Precedence: --nproc-per-node > --cpu-workers / DDP_LAUNCH_CPU_WORKERS > the scheduler's
count > the node's GPUs > one CPU worker.

The scheduler's count may be one of torchrun's words, as a training operator passes them on
(PET_NPROC_PER_NODE: "Number of workers per node; supported values: [auto, cpu, gpu, int]",
kubeflow/training-operator, pkg/apis/kubeflow.org/v1/pytorch_types.go). Each is resolved here by
torchrun's own rule (torch/distributed/run.py, determine_local_world_size), into the count torchrun
is then given: cpu is one worker per CPU this process may run on (torch._utils.cpu_count:
sched_getaffinity, as NodeFacts.cpu_count); gpu is one per GPU, and none is an error ("Cuda is not
available"); auto is one per GPU, or without one, one per CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch.envvars import Setting
from ddp_launch.errors import LaunchError
from ddp_launch.gpus import GpuCount
from ddp_launch.launch_options import LaunchOptions
from ddp_launch.plan import EnvChange

NO_GPU = "no GPU found"
TORCHRUN_WORDS = ("auto", "cpu", "gpu")


@dataclass(frozen=True)
class Workers:
    count: int
    source: str
    on_cpu: bool


def workers_per_node(options: LaunchOptions, scheduler: Setting | None, gpus: GpuCount | None,
                     cpu_count: int = 1) -> Workers:
    """Workers on this node: --nproc-per-node > --cpu-workers/env > scheduler > GPUs > 1 CPU worker."""
    if options.nproc_per_node is not None:
        return Workers(options.nproc_per_node, "--nproc-per-node", on_cpu=False)
    if options.cpu_workers is not None:
        return Workers(int(options.cpu_workers.value), options.cpu_workers.source, on_cpu=True)
    if scheduler is not None and scheduler.value in TORCHRUN_WORDS:
        return torchrun_word(scheduler, gpus, cpu_count)
    if scheduler is not None:
        return Workers(int(scheduler.value), scheduler.source, on_cpu=False)
    if gpus is not None and gpus.count > 0:
        return Workers(gpus.count, gpus.source, on_cpu=False)
    return Workers(1, NO_GPU, on_cpu=True)


def torchrun_word(asked: Setting, gpus: GpuCount | None, cpu_count: int) -> Workers:
    """auto, cpu or gpu as torchrun counts them; on CPU the GPUs are hidden, as --cpu-workers hides them."""
    said = f"{asked.source}={asked.value}"
    if asked.value != "cpu" and gpus is not None and gpus.count > 0:
        return Workers(gpus.count, f"{said}: {gpus.source}", on_cpu=False)
    if asked.value == "gpu":
        seen = f"{gpus.source}={gpus.count}" if gpus is not None else "no visible-device variable, no device files"
        raise LaunchError(f"{said} but no GPU is visible here ({seen}): torchrun stops the same way (\"Cuda is not "
                          f"available\") and nothing trains on CPU in its place: request GPUs for the pod, or set "
                          f"nprocPerNode to cpu, auto or a count")
    why = "one per CPU" if asked.value == "cpu" else "no GPU: one per CPU"
    return Workers(cpu_count, f"{said} ({why} this process may run on, as torchrun counts them)", on_cpu=True)


def workers_env(workers: Workers, env: Mapping[str, str], cpu_count: int) -> tuple[EnvChange, ...]:
    changes = []
    if workers.on_cpu and workers.source != NO_GPU:
        # Every vendor: HIP honours CUDA_VISIBLE_DEVICES as it does HIP_VISIBLE_DEVICES (ROCm docs,
        # GPU isolation techniques), so ROCm's torch hides its GPUs too.
        changes.append(EnvChange("CUDA_VISIBLE_DEVICES", "",
                                 f"{workers.source}: workers run on CPU with gloo, GPUs hidden"))
    if workers.count > 1 and "OMP_NUM_THREADS" not in env:
        threads = max(1, cpu_count // workers.count)
        changes.append(EnvChange("OMP_NUM_THREADS", str(threads),
                                 f"unset; torchrun would force 1: {cpu_count} CPUs / {workers.count} workers"))
    return tuple(changes)


def worker_notes(workers: Workers) -> tuple[str, ...]:
    if workers.source == NO_GPU:
        return ("no GPU found: 1 CPU worker per node with gloo (set --cpu-workers N for more)",)
    return (f"{workers.count} worker(s) per node from {workers.source}",)
