"""RunAI and Kubeflow (PyTorchJob v1, Trainer v2): one torchrun per pod, c10d at the master.

Both set torchrun's own PET_* names; the pod-level RANK/WORLD_SIZE describe
pods (RunAI's WORLD_SIZE is already pods x GPUs), so the workers must not see them.
An elastic PyTorchJob (elasticPolicy) gives its pods PET_RDZV_ENDPOINT, PET_RDZV_BACKEND,
PET_NNODES=MIN:MAX and no rank: torchrun's c10d rendezvous numbers the pods, and the pod
whose name the endpoint names hosts it (kubeflow/training-operator,
pkg/controller.v1/pytorch/elastic.go: the endpoint is <job>-worker-0:<port> unless rdzvHost says).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch import gpus as gpu_count
from ddp_launch.accelerators import Accelerator
from ddp_launch.envvars import Setting, first_set, integer, is_digits, port
from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts, ProbeQuestions
from ddp_launch.forensics import flight_recorder_env
from ddp_launch.job_identity import JobIdentity
from ddp_launch.node_workers import TORCHRUN_WORDS, worker_notes, workers_env, workers_per_node
from ddp_launch.launch_options import LaunchOptions
from ddp_launch.plan import Endpoint, EnvChange, LaunchPlan
from ddp_launch.rendezvous import Head, ipv4_literal, is_loopback
from ddp_launch.torchrun_command import (Rendezvous, job_rdzv_conf, join_timeout, max_restarts, node_log_dir,
                                         torchrun_command, torchrun_env)

# --mode names and their lines in ddp-launch --help.
MODES = {"kubeflow": "PET_NNODES or PET_MASTER_ADDR set (RunAI, Kubeflow): torchrun per pod"}
# Auto detection's place (schedulers/__init__.py): after SLURM, whose jobs never set PET_*.
DETECTION_PLACE = 30
HELP = ""
NODE_NAME: tuple[str, ...] = ()   # a pod's name is its host name (identity() below)

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
    "rdzv_endpoint": ("PET_RDZV_ENDPOINT",),
    "rdzv_backend": ("PET_RDZV_BACKEND",),
}
# Which workload a pod belongs to, first set wins: Run:ai's built-in variables (NVIDIA Run:ai docs,
# "Workloads", Built-in Workload Environment Variables: RUNAI_JOB_UUID "a unique identifier for the
# workload. If a workload is deleted and recreated with the same name, the UUID will be different";
# RUNAI_JOB_NAME "the logical name of the workload as submitted"), then the names older Run:ai
# clusters set (docs.run.ai v2.16, "Environment Variables inside a Run:ai Workload": JOB_UUID,
# JOB_NAME). Both stay the same in every pod of the workload and across its pods' restarts.
IDENTITY_VARIABLES = {
    "workload_uuid": ("RUNAI_JOB_UUID", "JOB_UUID"),
    "workload_name": ("RUNAI_JOB_NAME", "JOB_NAME"),
}
# The pod names a PyTorchJob's operator gives, whose rendezvous host is one: Kubeflow's training
# operator v1 names a replica's pod <job>-<master|worker>-<index> (pkg/controller.v1/pytorch/envvar.go,
# genGeneralName), Trainer v2's JobSet <trainjob>-node-<job index>-<pod index> (a Job's indexed pod's
# host name is <job>-<index>, Kubernetes "Jobs", Completion mode).
OPERATOR_POD_NAME = re.compile(r"(?P<job>[a-z0-9]([-a-z0-9]*[a-z0-9])?)-(?:(?:master|worker)-\d+|node-\d+-\d+)")
# torchrun's port where an endpoint names none (parse_rendezvous_endpoint's default_port for c10d,
# torch/distributed/elastic/rendezvous/utils.py).
C10D_DEFAULT_PORT = 29400
# Every variable the operator (torchrun's own PET_* names: torch.distributed.run reads each flag
# from PET_<FLAG>) and RunAI set in a pod starts with one of these.
ENV_PREFIXES = ("PET_", "RUNAI_")
# The GPUs Run:ai granted the pod (NVIDIA Run:ai docs, "Workloads", Built-in Workload Environment
# Variables: RUNAI_NUM_OF_GPUS, "the number of GPUs allocated to the workload"; fractional GPUs read "0.5").
GPU_GRANT = gpu_count.GrantVariables(pod_count=("RUNAI_NUM_OF_GPUS",))
# Either one marks a PyTorchJob/TrainJob pod (RunAI sets PET_NNODES).
DETECTED_BY = ("PET_NNODES", "PET_MASTER_ADDR")
# Pod-level values torchrun replaces with per-worker ones; removed so no
# worker can mistake them for its own.
POD_LEVEL = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# The operator's pod rank, which torchrun reads as --node-rank (torch.distributed.run reads each flag
# from PET_<FLAG>): the c10d rendezvous numbers the pods itself and ignores it with a warning in every
# pod but rank 0's ("node_rank is only used for static rdzv_backend", torch/distributed/run.py).
STATIC_ONLY = ("PET_NODE_RANK",)


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
    rdzv_endpoint: tuple[str, int] | None      # PET_RDZV_ENDPOINT: an elastic job's rendezvous (host, port)
    rdzv_conf: tuple[tuple[str, str], ...]     # PET_RDZV_CONF, merged into --rdzv-conf
    gpus: gpu_count.GpuGrant | None     # what the pod was granted (checked against the driver)
    accelerator: Accelerator            # the site's GPU vendor: whose variables and device files count
    workload: tuple[str | None, str | None] = (None, None)   # Run:ai's (uuid, name) of the workload
    workload_source: str = ""


def _nnodes(value: str) -> int:
    parts = value.split(":")
    if len(parts) in (1, 2) and all(is_digits(p) and int(p) > 0 for p in parts):
        if int(parts[0]) > int(parts[-1]):
            raise LaunchError(f"PET_NNODES={value!r} asks for at least {parts[0]} but at most {parts[-1]} "
                              f"nodes: write it as MIN:MAX with MIN <= MAX")
        return int(parts[-1])
    raise LaunchError(f"PET_NNODES={value!r} is not a node count: expected 'N' or 'MIN:MAX'")


def _endpoint(value: str) -> tuple[str, int]:
    """PET_RDZV_ENDPOINT as torchrun reads it: HOST, HOST:PORT or [IPv6]:PORT."""
    host, port_text = value, None
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
    if not host:
        raise LaunchError(f"PET_RDZV_ENDPOINT={value!r} names no host: expected HOST:PORT "
                          f"(Kubeflow: elasticPolicy.rdzvHost and rdzvPort)")
    return host, port("PET_RDZV_ENDPOINT port", port_text) if port_text else C10D_DEFAULT_PORT


def _backend(env: Mapping[str, str]) -> None:
    backend, name = _first(env, "rdzv_backend")
    if backend is not None and backend != "c10d":
        raise LaunchError(f"{name}={backend!r}: ddp-launch runs torchrun's c10d rendezvous only; set "
                          f"elasticPolicy.rdzvBackend to c10d (the operator's default) or unset it")


def parse(env: Mapping[str, str], accelerator: Accelerator) -> KubeflowEnv:
    nnodes, _ = _first(env, "nnodes")
    addr, addr_name = _first(env, "master_addr")
    if nnodes is None:
        raise LaunchError("PET_NNODES is not set: this does not look like a RunAI/Kubeflow PyTorchJob pod; "
                          "use --mode local or set PET_NNODES")
    nproc = _workers_asked(env)
    rank_value, rank_name = _first(env, "node_rank")
    port_value, port_name = _first(env, "master_port")
    run_id, _ = _first(env, "run_id")
    restarts = first_set(env, VARIABLES["max_restarts"])
    endpoint, _ = _first(env, "rdzv_endpoint")
    _backend(env)
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
        rdzv_endpoint=_endpoint(endpoint) if endpoint is not None else None,
        rdzv_conf=job_rdzv_conf(env),
        gpus=gpu_count.granted_gpus(env, accelerator, GPU_GRANT),
        accelerator=accelerator,
        workload=(_optional(env, "workload_uuid"), _optional(env, "workload_name")),
        workload_source=" and ".join(found.source for found in (first_set(env, IDENTITY_VARIABLES[key])
                                                                 for key in IDENTITY_VARIABLES) if found),
    )


def _workers_asked(env: Mapping[str, str]) -> Setting | None:
    """The pod's GPUs (RunAI), else the operator's nprocPerNode: a count, or torchrun's auto, cpu or
    gpu (node_workers.torchrun_word resolves those as torchrun does). RUNAI_NUM_OF_GPUS=0, a pod
    without GPUs, is no count at all: torchrun asserts local_world_size > 0
    (torch/distributed/elastic/agent/server/api.py, WorkerSpec) and dies with a bare traceback."""
    runai_gpus, operator = VARIABLES["nproc"]
    granted = first_set(env, (runai_gpus,))
    if granted is not None and integer(granted.source, granted.value) > 0:
        return Setting(int(granted.value), granted.source)
    asked = first_set(env, (operator,))
    if asked is None or asked.value in TORCHRUN_WORDS:
        return asked
    return Setting(integer(asked.source, asked.value, minimum=1, expected="auto, cpu, gpu or a count of workers >= 1",
                           fix="set the job's nprocPerNode to one of those (torchrun's --nproc-per-node)"),
                   asked.source)


def _wants_gpus(job: KubeflowEnv, options: LaunchOptions) -> bool:
    """nprocPerNode gpu decides the workers (no flag or setting of ours overrides it)."""
    return (job.nproc is not None and job.nproc.value == "gpu" and options.nproc_per_node is None
            and options.cpu_workers is None)


def _cpu_on_purpose(job: KubeflowEnv, options: LaunchOptions) -> object:
    """What makes the workers run on CPU on purpose: --cpu-workers, or nprocPerNode cpu."""
    if options.cpu_workers is not None or options.nproc_per_node is not None:
        return options.cpu_workers
    return job.nproc if job.nproc is not None and job.nproc.value == "cpu" else None


def _optional(env: Mapping[str, str], key: str) -> str | None:
    found = first_set(env, IDENTITY_VARIABLES[key])
    return str(found.value) if found else None


def head(job: KubeflowEnv, options: LaunchOptions) -> Head | None:
    """The rendezvous host: --rdzv-host, else the elastic endpoint's (torchrun's c10d meets there
    whatever MASTER_ADDR says), else the job's master address (None: none of them)."""
    if options.rdzv_host is not None:
        return Head.named(str(options.rdzv_host.value), options.rdzv_host.source)
    if job.rdzv_endpoint is not None:
        return Head.named(job.rdzv_endpoint[0], "PET_RDZV_ENDPOINT")
    if job.master_addr is not None:
        return Head.named(job.master_addr, job.master_addr_source)
    return None


def identity(job: KubeflowEnv, facts: NodeFacts) -> JobIdentity:
    """The workload (Run:ai's uuid and name), else the PyTorchJob's name in its rendezvous host's
    (the operator's pod names), else this pod's own name; the pod's name is its host name
    (Kubernetes, "Container Environment": "The hostname of a Container is the name of the Pod in
    which the Container is running"). All three survive a container's restart, which keeps the pod
    (Kubernetes, "Pod Lifecycle", Container restart policy: the kubelet restarts a pod's containers
    after they exit), and none is shared by two live jobs: object names are unique in a namespace
    (Kubernetes, "Object Names and IDs")."""
    pod = facts.hostname.split(".")[0] or None
    uuid, name = job.workload
    # The workload's name names NCCL's log file (nccl-<name>.%h.%p.log), as a user who submitted it knows it.
    node = {"node_name": pod, "node_source": "the pod's host name (its name)", "file_name": name}
    if uuid or name:
        return JobIdentity(f"{name}/{uuid}" if uuid and name else uuid or name, job.workload_source, **node)
    host = job.rdzv_endpoint[0] if job.rdzv_endpoint is not None else job.master_addr
    source = "PET_RDZV_ENDPOINT" if job.rdzv_endpoint is not None else job.master_addr_source
    if host is not None and ipv4_literal(host) is None and ":" not in host:
        named = OPERATOR_POD_NAME.fullmatch(host.split(".")[0].lower())
        if named:
            return JobIdentity(named.group("job"), f"the PyTorchJob's name in {source}={host}", **node)
    if pod is None:
        return JobIdentity(None, "", None, "")
    return JobIdentity(f"pod {pod}", "the pod's host name (no workload or job name in its environment)", **node)


def questions(job: KubeflowEnv, options: LaunchOptions) -> ProbeQuestions:
    """Look up the master, waiting for its DNS record (not on a dry run); ask the GPU driver
    about the GPUs the pod was granted."""
    return ProbeQuestions(head=head(job, options),
                          cuda=(gpu_count.grant_to_check(job.gpus, _cpu_on_purpose(job, options)) is not None
                                or _wants_gpus(job, options)),
                          dns_wait_s=options.dns_timeout_s if not options.dry_run else None)


def hosts_by_name(rendezvous: str, hostname: str) -> bool | None:
    """Whether this pod is the rendezvous host named: its own name (the pod's hostname is the pod's
    name, Kubernetes "Container Environment"), first labels compared; None for an address, which
    torchrun matches against the machine's own addresses itself (is_host left out)."""
    if ipv4_literal(rendezvous) is not None or ":" in rendezvous:
        return None
    return rendezvous.split(".")[0].lower() == hostname.split(".")[0].lower()


def _is_head(job: KubeflowEnv, options: LaunchOptions, name: str, hostname: str) -> bool | None:
    """A pod's rank says it hosts the master (rank 0 is master-0); an elastic endpoint names a pod
    (worker-0 by default), which may not be rank 0, and an elastic pod has no rank."""
    by_endpoint = options.rdzv_host is None and job.rdzv_endpoint is not None
    if job.node_rank is not None and not by_endpoint:
        return job.node_rank == 0
    return hosts_by_name(name, hostname)


def other_pod_announcement(this_pod: str, head_note: str, port: int, workers: int, log_dir: str | None) -> str:
    """What a pod that does not host the rendezvous says before its workers start. A pod has a log of its
    own (`runai logs`, `kubectl logs`), and the trainer prints from global rank 0 alone: without this line,
    a worker pod's log ends at its checks, as if it hung."""
    logs = f"; its workers log to {log_dir}" if log_dir else ""
    return (f"ddp-launch: {this_pod} joins the rendezvous ({head_note}, port {port}) with {workers} worker(s); "
            f"the progress is printed by rank 0 alone, in the log of the pod that hosts the rendezvous{logs}")


def plan(job: KubeflowEnv, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    multi = job.max_nodes > 1
    if options.nodes is not None and options.nodes != job.max_nodes:
        raise LaunchError(f"--nodes {options.nodes} but PET_NNODES={job.nnodes}: match the job's pod count "
                          f"or drop --nodes")
    if job.node_rank is None and multi and job.rdzv_endpoint is None:
        raise LaunchError("PET_NODE_RANK and RANK are unset: this pod cannot tell whether it hosts the "
                          "rendezvous; the operator sets them, so check the job spec")
    if options.rdzv_host is None and job.master_addr is None and job.rdzv_endpoint is None:
        raise LaunchError(f"PET_NNODES={job.nnodes} is set but {job.master_addr_source} is not: the job's "
                          f"master address is missing; pass --rdzv-host with the master pod's service name")
    # The master questions() named, and its one lookup.
    name, source, address = facts.head.asked.checked(), facts.head.asked.source, facts.head.address
    is_head = _is_head(job, options, name, facts.hostname) if multi else True
    pod = (f"pod{job.node_rank}" if job.node_rank is not None
           else facts.hostname.split(".")[0] or "pod") if multi else None
    if address is None:
        host, head_note = name, f"rendezvous host {name} ({source}) did not resolve yet: passing the name"
    else:
        host, head_note = address, f"rendezvous host {name} ({source}) = {address}"
    if multi and not is_head and is_loopback(host):
        which = f"pod rank {job.node_rank}" if job.node_rank is not None else f"pod {pod}"
        raise LaunchError(f"{source}={name!r} is a loopback address on {which} of "
                          f"{job.max_nodes}: it would rendezvous with itself; give the master's service name")
    if options.rdzv_port is not None:
        rdzv_port, port_note = int(options.rdzv_port.value), f"port from {options.rdzv_port.source}"
    elif job.rdzv_endpoint is not None:
        rdzv_port, port_note = job.rdzv_endpoint[1], "port from PET_RDZV_ENDPOINT"
    elif job.master_port is not None:
        rdzv_port, port_note = job.master_port, "port from the job's master port"
    else:
        raise LaunchError("PET_MASTER_PORT and MASTER_PORT are unset: pass --rdzv-port P")
    if _wants_gpus(job, options) and facts.cuda_problem is not None:
        vendor = job.accelerator
        raise LaunchError(f"{job.nproc.source}=gpu but {vendor.runtime} cannot use a GPU here ({facts.cuda_problem}): "
                          f"torchrun stops the same way (\"Cuda is not available\") and nothing trains on CPU in its "
                          f"place: check that the pod requests {vendor.kubernetes_resource} and {vendor.device_plugin} "
                          f"runs on the node, or set nprocPerNode to cpu, auto or a count")
    gpus_here = gpu_count.count_gpus(env, facts.gpu_device_files, job.accelerator, GPU_GRANT)
    workers = workers_per_node(options, job.nproc, gpus_here, facts.cpu_count)
    restarts = max_restarts(options, job.max_restarts)
    rendezvous = Rendezvous(host, rdzv_port, job.run_id or job.master_addr or name, is_head,
                            join_timeout(options, job.rdzv_conf), job.rdzv_conf)
    log_dir = node_log_dir(options.log_dir, pod)
    argv = torchrun_command(facts.python, job.nnodes, workers.count, rendezvous, restarts, log_dir,
                            options.workload)
    removed = tuple(EnvChange(variable, None, "describes the pod, not a worker; torchrun sets the workers' own")
                    for variable in POD_LEVEL if variable in env)
    removed += tuple(EnvChange(variable, None, "torchrun's --node-rank, for its static rendezvous only: c10d numbers "
                               "the pods itself (and warns of it)") for variable in STATIC_ONLY if variable in env)
    if job.node_rank is not None or not multi:
        this_pod = f"pod {job.node_rank if job.node_rank is not None else 0} of {job.nnodes}"
    else:
        this_pod = f"pod {pod} of {job.nnodes} (elastic: torchrun's rendezvous numbers the pods)"
    host_note = {True: " (rendezvous host)", False: "",
                 None: f" (whether it hosts {name} is torchrun's to tell: an address, not a pod name)"}[is_head]
    notes = (this_pod + host_note, head_note, port_note, *worker_notes(workers))
    changes = (removed + torchrun_env(env, restarts, log_dir, pod or "pod0", options.workload)
               + workers_env(workers, env, facts.cpu_count) + flight_recorder_env(env))
    if multi and is_head:
        announcement = f"ddp-launch: {job.max_nodes} pods: {head_note}, port {rdzv_port}"
    elif multi:
        announcement = other_pod_announcement(this_pod, head_note, rdzv_port, workers.count, log_dir)
    else:
        announcement = None
    gpu_count.require_usable_gpus(gpu_count.grant_to_check(job.gpus, _cpu_on_purpose(job, options)),
                                  facts.cuda_problem, on_kubernetes=True, gpu_device_files=facts.gpu_device_files)
    return LaunchPlan("kubeflow", argv, changes, notes, job.max_nodes, Endpoint(host, rdzv_port, address, is_head),
                      announcement=announcement,
                      min_nodes=int(job.nnodes.split(":")[0]) if ":" in job.nnodes else None)
