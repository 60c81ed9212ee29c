"""RunAI and Kubeflow (PyTorchJob v1, Trainer v2): one torchrun per pod, c10d at the master.

Both set torchrun's own PET_* names; the pod-level RANK/WORLD_SIZE describe
pods (RunAI's WORLD_SIZE is already pods x GPUs), so the workers must not see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch import gpus as gpu_count
from ddp_launch.accelerators import Accelerator
from ddp_launch.envvars import Setting, first_set, integer, is_digits, port
from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts, ProbeQuestions
from ddp_launch.forensics import flight_recorder_env
from ddp_launch.node_workers import worker_notes, workers_env, workers_per_node
from ddp_launch.launch_options import LaunchOptions
from ddp_launch.plan import Endpoint, EnvChange, LaunchPlan
from ddp_launch.rendezvous import Head, is_loopback
from ddp_launch.torchrun_command import (Rendezvous, join_timeout, max_restarts, node_log_dir,
                                         torchrun_command, torchrun_env)

# --mode names and their lines in ddp-launch --help.
MODES = {"kubeflow": "PET_NNODES or PET_MASTER_ADDR set (RunAI, Kubeflow): torchrun per pod"}

# First variable set wins. PET_* first: Trainer v2 sets only those, v1 sets
# both with equal values, RunAI sets MASTER_ADDR (an IP) and RANK.
VARIABLES = {
    "nnodes": ("PET_NNODES",),
    "nproc": ("RUNAI_NUM_OF_GPUS", "PET_NPROC_PER_NODE"),
    "node_rank": ("PET_NODE_RANK", "RANK"),
    "master_addr": ("PET_MASTER_ADDR", "MASTER_ADDR"),
    "master_port": ("PET_MASTER_PORT", "MASTER_PORT"),
    "run_id": ("PET_RDZV_ID",),
    "max_restarts": ("PET_MAX_RESTARTS",),
}
# Either one marks a PyTorchJob/TrainJob pod (RunAI sets PET_NNODES).
DETECTED_BY = ("PET_NNODES", "PET_MASTER_ADDR")
# Pod-level values torchrun replaces with per-worker ones; removed so no
# worker can mistake them for its own.
POD_LEVEL = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def detect(env: Mapping[str, str]) -> bool:
    return any(env.get(name) for name in DETECTED_BY)


def _first(env: Mapping[str, str], key: str) -> tuple[str | None, str]:
    """(value, its variable), or (None, "A or B") naming what was looked for."""
    found = first_set(env, VARIABLES[key])
    return (str(found.value), found.source) if found else (None, " or ".join(VARIABLES[key]))


@dataclass(frozen=True)
class KubeflowEnv:
    nnodes: str                   # "2", or "1:4" for an elastic job
    max_nodes: int
    nproc: Setting | None
    node_rank: int | None
    master_addr: str | None       # None: --rdzv-host must name the master
    master_addr_source: str
    master_port: int | None
    run_id: str | None
    max_restarts: Setting | None
    gpus: gpu_count.GpuGrant | None     # what the pod was granted (checked against the driver)
    accelerator: Accelerator            # the site's GPU vendor: whose variables and device files count


def _nnodes(value: str) -> int:
    parts = value.split(":")
    if len(parts) in (1, 2) and all(is_digits(p) and int(p) > 0 for p in parts):
        if int(parts[0]) > int(parts[-1]):
            raise LaunchError(f"PET_NNODES={value!r} asks for at least {parts[0]} but at most {parts[-1]} "
                              f"nodes: write it as MIN:MAX with MIN <= MAX")
        return int(parts[-1])
    raise LaunchError(f"PET_NNODES={value!r} is not a node count: expected 'N' or 'MIN:MAX'")


def parse(env: Mapping[str, str], accelerator: Accelerator) -> KubeflowEnv:
    nnodes, _ = _first(env, "nnodes")
    addr, addr_name = _first(env, "master_addr")
    if nnodes is None:
        raise LaunchError("PET_NNODES is not set: this does not look like a RunAI/Kubeflow PyTorchJob pod; "
                          "use --mode local or set PET_NNODES")
    nproc_value, nproc_name = _first(env, "nproc")
    nproc = None
    if nproc_value is not None and nproc_value not in ("auto", "gpu"):
        nproc = Setting(integer(nproc_name, nproc_value), nproc_name)
    rank_value, rank_name = _first(env, "node_rank")
    port_value, port_name = _first(env, "master_port")
    run_id, _ = _first(env, "run_id")
    restarts = first_set(env, VARIABLES["max_restarts"])
    max_nodes = _nnodes(nnodes)
    node_rank = integer(rank_name, rank_value) if rank_value is not None else None
    if node_rank is not None and node_rank >= max_nodes:
        raise LaunchError(f"{rank_name}={rank_value} but PET_NNODES={nnodes}: a pod's rank must be below the "
                          f"node count; check the job spec (replicas) or the variables set by hand")
    return KubeflowEnv(
        nnodes=nnodes,
        max_nodes=max_nodes,
        nproc=nproc,
        node_rank=node_rank,
        master_addr=addr,
        master_addr_source=addr_name,
        master_port=port(port_name, port_value) if port_value is not None else None,
        run_id=run_id,
        max_restarts=restarts,
        gpus=gpu_count.granted_gpus(env, accelerator),
        accelerator=accelerator,
    )


def head(job: KubeflowEnv, options: LaunchOptions) -> Head | None:
    """The rendezvous host: --rdzv-host, else the job's master address (None: neither)."""
    if options.rdzv_host is not None:
        return Head.named(str(options.rdzv_host.value), options.rdzv_host.source)
    if job.master_addr is not None:
        return Head.named(job.master_addr, job.master_addr_source)
    return None


def questions(job: KubeflowEnv, options: LaunchOptions) -> ProbeQuestions:
    """Look up the master, waiting for its DNS record (not on a dry run); ask the GPU driver
    about the GPUs the pod was granted."""
    return ProbeQuestions(head=head(job, options),
                          cuda=gpu_count.grant_to_check(job.gpus, options.cpu_workers) is not None,
                          dns_wait_s=options.dns_timeout_s if not options.dry_run else None)


def plan(job: KubeflowEnv, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    multi = job.max_nodes > 1
    if options.nodes is not None and options.nodes != job.max_nodes:
        raise LaunchError(f"--nodes {options.nodes} but PET_NNODES={job.nnodes}: match the job's pod count "
                          f"or drop --nodes")
    if job.node_rank is None and multi:
        raise LaunchError("PET_NODE_RANK and RANK are unset: this pod cannot tell whether it hosts the "
                          "rendezvous; the operator sets them, so check the job spec")
    is_head = (job.node_rank or 0) == 0
    if options.rdzv_host is None and job.master_addr is None:
        raise LaunchError(f"PET_NNODES={job.nnodes} is set but {job.master_addr_source} is not: the job's "
                          f"master address is missing; pass --rdzv-host with the master pod's service name")
    # The master questions() named, and its one lookup.
    name, source, address = facts.head.asked.checked(), facts.head.asked.source, facts.head.address
    if address is None:
        host, head_note = name, f"rendezvous host {name} ({source}) did not resolve yet: passing the name"
    else:
        host, head_note = address, f"rendezvous host {name} ({source}) = {address}"
    if multi and not is_head and is_loopback(host):
        raise LaunchError(f"{source}={name!r} is a loopback address on pod rank {job.node_rank} of "
                          f"{job.max_nodes}: it would rendezvous with itself; give the master's service name")
    if options.rdzv_port is not None:
        rdzv_port, port_note = int(options.rdzv_port.value), f"port from {options.rdzv_port.source}"
    elif job.master_port is not None:
        rdzv_port, port_note = job.master_port, "port from the job's master port"
    else:
        raise LaunchError("PET_MASTER_PORT and MASTER_PORT are unset: pass --rdzv-port P")
    workers = workers_per_node(options, job.nproc, gpu_count.count_gpus(env, facts.gpu_device_files, job.accelerator))
    restarts = max_restarts(options, job.max_restarts)
    rendezvous = Rendezvous(host, rdzv_port, job.run_id or job.master_addr or name, is_head, join_timeout(options))
    log_dir = node_log_dir(options.log_dir, f"pod{job.node_rank or 0}" if multi else None)
    argv = torchrun_command(facts.python, job.nnodes, workers.count, rendezvous, restarts, log_dir,
                            options.workload)
    removed = tuple(EnvChange(variable, None, "describes the pod, not a worker; torchrun sets the workers' own")
                    for variable in POD_LEVEL if variable in env)
    notes = (f"pod {job.node_rank if job.node_rank is not None else 0} of {job.nnodes}"
             + (" (rendezvous host)" if is_head else ""),
             head_note, port_note, *worker_notes(workers))
    changes = (removed + torchrun_env(env, restarts, log_dir, f"pod{job.node_rank or 0}")
               + workers_env(workers, env, facts.cpu_count) + flight_recorder_env(env))
    announcement = (f"ddp-launch: {job.max_nodes} pods: {head_note}, port {rdzv_port}"
                    if multi and is_head else None)
    gpu_count.require_usable_gpus(gpu_count.grant_to_check(job.gpus, options.cpu_workers), facts.cuda_problem,
                                  on_kubernetes=True, gpu_device_files=facts.gpu_device_files)
    return LaunchPlan("kubeflow", argv, changes, notes, job.max_nodes, Endpoint(host, rdzv_port, address),
                      announcement=announcement)
