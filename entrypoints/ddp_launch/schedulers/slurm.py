"""SLURM: read a job step's environment and plan one of its two launches.

slurm-node: one task per node, each runs torchrun (c10d) for that node's GPUs.
slurm-task: one task per GPU, each execs the trainer with env:// variables.
Which of the two is decided here (auto_mode), the same way on every node of the step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ddp_contract import TASK_DEVICE_VAR
from ddp_launch import gpus as gpu_count
from ddp_launch.accelerators import Accelerator
from ddp_launch.envvars import Setting, first_set, integer
from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts, ProbeQuestions
from ddp_launch.forensics import flight_recorder_env
from ddp_launch.job_identity import JobIdentity
from ddp_launch.node_workers import worker_notes, workers_env, workers_per_node
from ddp_launch.schedulers.nodelist import expand_nodelist
from ddp_launch.launch_options import LaunchOptions, Workload
from ddp_launch.plan import Endpoint, EnvChange, LaunchPlan
from ddp_launch.rendezvous import Head, is_loopback, rendezvous_port
from ddp_launch.torchrun_command import (Rendezvous, job_rdzv_conf, join_timeout, max_restarts, node_log_dir,
                                         torchrun_command, torchrun_env)

# --mode names and their lines in ddp-launch --help.
MODES = {
    "slurm-task": "SLURM_JOB_ID set and more than one task on a node: exec the workload\n"
                  "per task with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* (env://)",
    "slurm-node": "SLURM_JOB_ID set, one task per node: torchrun per node, c10d rendezvous",
}

# Auto detection's place (schedulers/__init__.py): after torchrun, before the pods.
DETECTION_PLACE = 20
# How a SLURM job finds its rendezvous, for ddp-launch --help (head() and _port() below).
HELP = """rendezvous on SLURM: the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
  as an IPv4 address when it resolves; port 20000 + (job id mod 1000) * 10 + (step id mod 10)"""

# Step-scoped names first: right for an srun that uses part of the allocation.
# Each list is tried in order; the first variable that is set wins.
STEP_VARIABLES = {
    "nodelist": ("SLURM_STEP_NODELIST",),
    "num_nodes": ("SLURM_STEP_NUM_NODES",),
    "num_tasks": ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
    "tasks_per_node": ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"),
}
JOB_VARIABLES = {
    "nodelist": ("SLURM_JOB_NODELIST", "SLURM_NODELIST"),
    "num_nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
    "num_tasks": ("SLURM_NTASKS", "SLURM_NPROCS"),
    "tasks_per_node": ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
}
# This node's name as SLURM knows it (srun sets it per task): the name ExcNodeList and --exclude take.
NODE_NAME = ("SLURMD_NODENAME",)
TASK_VARIABLES = {
    "job_id": ("SLURM_JOB_ID", "SLURM_JOBID"),   # SLURM_JOBID: the same id under its older name
    "step_id": ("SLURM_STEP_ID", "SLURM_STEPID"),
    "node_index": ("SLURM_NODEID",),       # this node's index in the step
    "node_name": NODE_NAME,
    "proc_id": ("SLURM_PROCID",),
    "local_id": ("SLURM_LOCALID",),
    "cpus_per_task": ("SLURM_CPUS_PER_TASK",),
}
# The three tables as one, the shape every scheduler module has: the step's
# names are read when SLURM_STEP_NODELIST is set (srun), else the job's.
VARIABLES = {"step": STEP_VARIABLES, "job": JOB_VARIABLES, "task": TASK_VARIABLES}
# The GPUs SLURM granted (sbatch(1) and srun(1), OUTPUT ENVIRONMENT VARIABLES): SLURM_GPUS_ON_NODE
# counts this node's; SLURM_GPUS_PER_NODE is --gpus-per-node as asked ("gpu:a100:4"); SLURM_STEP_GPUS
# and SLURM_JOB_GPUS are the node's own IDs of the step's and the job's GPUs ("The GPU IDs are not
# relative to any device cgroup, even if devices are constrained with task/cgroup"), the step's first.
GPU_GRANT = gpu_count.GrantVariables(on_node=("SLURM_GPUS_ON_NODE",), per_node=("SLURM_GPUS_PER_NODE",),
                                     device_ids=("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"))
# Every variable SLURM sets for a job or a step starts with one of these.
ENV_PREFIXES = ("SLURM_", "SLURMD_")
# What srun sets for each task (srun(1), OUTPUT ENVIRONMENT VARIABLES) that torchrun says of each worker:
# in a torchrun worker they take the worker's value (ddp_launch/worker_env.py), as srun would have set them
# had it started one task per worker. The values are torchrun's variables, or worker_env's LAYOUT ("L(xN)",
# SLURM's tasks-per-node form) and NODE_RANKS (the ranks on this node, SLURM_GTIDS's comma list).
TASK_AS_WORKER = {
    "SLURM_PROCID": "RANK", "SLURM_LOCALID": "LOCAL_RANK", "SLURM_NTASKS": "WORLD_SIZE", "SLURM_NPROCS": "WORLD_SIZE",
    "SLURM_STEP_NUM_TASKS": "WORLD_SIZE", "SLURM_NODEID": "GROUP_RANK", "SLURM_NTASKS_PER_NODE": "LOCAL_WORLD_SIZE",
    "SLURM_TASKS_PER_NODE": "LAYOUT", "SLURM_STEP_TASKS_PER_NODE": "LAYOUT", "SLURM_GTIDS": "NODE_RANKS",
}

_TASKS_ENTRY = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def detect(env: Mapping[str, str]) -> bool:
    return any(env.get(name) for name in TASK_VARIABLES["job_id"])


def _int(found: Setting | None) -> int | None:
    return None if found is None else integer(found.source, found.value)


def parse_tasks_per_node(value: str, name: str = "SLURM_TASKS_PER_NODE") -> tuple[int, ...]:
    """'2(x3),1' -> (2, 2, 2, 1): SLURM's compressed tasks-per-node list."""
    counts: list[int] = []
    for entry in value.split(","):
        match = _TASKS_ENTRY.fullmatch(entry.strip())
        if not match:
            raise LaunchError(f"{name}={value!r} is not a tasks-per-node list: expected a form like '4(x2)' or '3,2(x2)'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return tuple(counts)


@dataclass(frozen=True)
class SlurmEnv:
    job_id: int
    step_id: int | None
    in_step: bool                     # started by srun (not the batch script itself)
    nodes: tuple[str, ...]
    nodes_source: str
    node_index: int | None
    node_name: str | None
    tasks_per_node: tuple[int, ...] | None
    tasks_source: str                 # "SLURM_STEP_TASKS_PER_NODE='4(x2)'", for messages
    num_tasks: int | None
    proc_id: int | None
    local_id: int | None
    cpus_per_task: int | None
    gpus: gpu_count.GpuGrant | None  # what SLURM granted this node (checked against the driver)
    accelerator: Accelerator         # the site's GPU vendor: whose variables and device files count

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def this_node_index(self) -> int | None:
        if self.node_index is not None:
            return self.node_index
        if self.node_name in self.nodes:
            return self.nodes.index(self.node_name)
        return None

    def tasks_here(self) -> int | None:
        if self.tasks_per_node is None:
            return None
        index = self.this_node_index()
        if index is None:
            return self.tasks_per_node[0] if len(set(self.tasks_per_node)) == 1 else None
        return self.tasks_per_node[index]

    def one_task_per_node(self) -> bool:
        """The same answer on every node of the step, so all nodes pick the same mode."""
        if self.tasks_per_node is not None:
            return max(self.tasks_per_node) == 1
        if self.num_tasks is not None:
            return self.num_tasks <= self.num_nodes
        return True


def parse(env: Mapping[str, str], accelerator: Accelerator) -> SlurmEnv:
    job = first_set(env, TASK_VARIABLES["job_id"])
    if job is None:
        raise LaunchError("SLURM_JOB_ID is not set: run under srun inside an allocation, or pass --mode local")
    scope = STEP_VARIABLES if first_set(env, STEP_VARIABLES["nodelist"]) else JOB_VARIABLES
    listed = first_set(env, scope["nodelist"])
    if listed is None:
        raise LaunchError(
            f"{job.source}={job.value} is set but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is: "
            f"start ddp-launch with srun inside the allocation (or --mode local for one machine)")
    nodes = expand_nodelist(listed.value, listed.source)
    counted = first_set(env, scope["num_nodes"])
    if counted is not None and _int(counted) != len(nodes):
        raise LaunchError(f"{counted.source}={counted.value} but {listed.source}={listed.value!r} names "
                          f"{len(nodes)} node(s): the environment is inconsistent; unset the stale one")

    tasks = first_set(env, scope["tasks_per_node"]) or first_set(env, JOB_VARIABLES["tasks_per_node"])
    tasks_per_node = None
    if tasks is not None:
        tasks_per_node = parse_tasks_per_node(tasks.value, tasks.source)
        if tasks.source == "SLURM_NTASKS_PER_NODE":
            if len(tasks_per_node) != 1:
                raise LaunchError(f"SLURM_NTASKS_PER_NODE={tasks.value!r} is not one integer: fix or unset it")
            tasks_per_node = tasks_per_node * len(nodes)
        elif len(tasks_per_node) != len(nodes):
            raise LaunchError(f"{tasks.source}={tasks.value!r} lists {len(tasks_per_node)} node(s) but "
                              f"{listed.source} names {len(nodes)}: the environment is inconsistent")
    node_name = first_set(env, TASK_VARIABLES["node_name"])
    node_index = _int(first_set(env, TASK_VARIABLES["node_index"]))
    if node_index is not None and node_index >= len(nodes):
        raise LaunchError(f"SLURM_NODEID={node_index} but {listed.source} names only {len(nodes)} node(s)")
    if node_name is not None:
        _check_node_name(node_name.value, node_index, nodes, listed)
    num_tasks = first_set(env, scope["num_tasks"])
    proc_id = _int(first_set(env, TASK_VARIABLES["proc_id"]))
    if proc_id is not None and num_tasks is not None and proc_id >= _int(num_tasks):
        raise LaunchError(f"SLURM_PROCID={proc_id} but {num_tasks.source}={num_tasks.value}: a task id must be "
                          f"below the task count; the environment is inconsistent (start ddp-launch with srun)")
    slurm = SlurmEnv(
        job_id=_int(job) or 0,
        step_id=_int(first_set(env, TASK_VARIABLES["step_id"])),
        in_step=bool(first_set(env, ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NODELIST"))),
        nodes=nodes,
        nodes_source=listed.source,
        node_index=node_index,
        node_name=node_name.value if node_name else None,
        tasks_per_node=tasks_per_node,
        tasks_source=f"{tasks.source}={tasks.value!r}" if tasks else "",
        num_tasks=_int(num_tasks),
        proc_id=proc_id,
        local_id=_int(first_set(env, TASK_VARIABLES["local_id"])),
        cpus_per_task=_int(first_set(env, TASK_VARIABLES["cpus_per_task"])),
        gpus=gpu_count.granted_gpus(env, accelerator, GPU_GRANT),
        accelerator=accelerator,
    )
    here = slurm.tasks_here()
    if slurm.local_id is not None and here is not None and slurm.local_id >= here:
        raise LaunchError(f"SLURM_LOCALID={slurm.local_id} but {slurm.tasks_source} runs {here} task(s) on "
                          f"this node: a local id must be below that; the environment is inconsistent")
    return slurm


def _check_node_name(name: str, index: int | None, nodes: tuple[str, ...], listed: Setting) -> None:
    """SLURMD_NODENAME is a node of the list, at SLURM_NODEID when both are set (srun sets both)."""
    if name not in nodes:
        raise LaunchError(f"SLURMD_NODENAME={name!r} is not in {listed.source}={listed.value!r}: this environment "
                          f"is not this node's (copied from another job or node?); start ddp-launch with srun")
    position = nodes.index(name)
    if index is not None and index != position:
        raise LaunchError(f"SLURM_NODEID={index} but SLURMD_NODENAME={name!r} is node {position} of "
                          f"{listed.source}: the environment is inconsistent; start ddp-launch with srun")


def auto_mode(slurm: SlurmEnv) -> str:
    """More than one task on any node of the step -> one task per GPU; else one torchrun per node."""
    return "slurm-node" if slurm.one_task_per_node() else "slurm-task"


def head(job: SlurmEnv, options: LaunchOptions) -> Head:
    """The rendezvous host: --rdzv-host, else the first node.

    An --rdzv-host is passed to torchrun as given; its address still picks the socket
    interface that routes to it on an Ethernet job (fabric/ethernet.py).
    """
    if options.rdzv_host is not None:
        return Head.named(str(options.rdzv_host.value), options.rdzv_host.source)
    return Head.named(job.nodes[0], f"the first host of {job.nodes_source}")


def peer(job: SlurmEnv, rendezvous: Head) -> tuple[str, str] | None:
    """Another node of the step and where it comes from, for a head whose own name is loopback to
    itself (fabric/ethernet.py)."""
    other = next((name for name in job.nodes if name != rendezvous.name), None)
    return (other, f"a node of {job.nodes_source}") if other is not None else None


def identity(job: SlurmEnv, facts: NodeFacts) -> JobIdentity:
    """The job id, which a requeue keeps (scontrol(1), requeue) and each task of a job array has of
    its own (sbatch(1): SLURM_ARRAY_JOB_ID is the array's, SLURM_JOB_ID the task's), as the job
    script's run-dir check names it (slurm/lib/ddp.sh); this node as SLURM names it."""
    index = job.this_node_index()
    if job.node_name is not None:
        node, source = job.node_name, "SLURMD_NODENAME"
    elif index is not None:
        node, source = job.nodes[index], f"node {index} of {job.nodes_source}"
    else:
        node, source = facts.hostname.split(".")[0] or None, "the host name"
    return JobIdentity(str(job.job_id), "SLURM_JOB_ID", node, source, file_name=str(job.job_id))


def questions(job: SlurmEnv, options: LaunchOptions) -> ProbeQuestions:
    """Look up the rendezvous host (and another node, where it is loopback here); ask the GPU
    driver about the GPUs SLURM granted."""
    rendezvous = head(job, options)
    return ProbeQuestions(head=rendezvous, peer=peer(job, rendezvous),
                          cuda=gpu_count.grant_to_check(job.gpus, options.cpu_workers) is not None)


def plan(job: SlurmEnv, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    """--mode slurm-node or slurm-task when given, else the one the step's layout asks for."""
    mode = options.mode if options.mode in MODES else auto_mode(job)
    launch = (_plan_node if mode == "slurm-node" else _plan_task)(job, options, env, facts)
    gpu_count.require_usable_gpus(gpu_count.grant_to_check(job.gpus, options.cpu_workers), facts.cuda_problem,
                                  on_kubernetes=False, gpu_device_files=facts.gpu_device_files)
    return launch


# -- shared checks and the rendezvous ------------------------------------------------------

def _check_nodes(slurm: SlurmEnv, options: LaunchOptions) -> None:
    if options.nodes is not None and options.nodes != slurm.num_nodes:
        raise LaunchError(f"--nodes {options.nodes} but SLURM gave this step {slurm.num_nodes} node(s) "
                          f"({slurm.nodes_source}): match srun -N / #SBATCH --nodes, or drop --nodes")
    if slurm.num_nodes > 1 and not slurm.in_step:
        raise LaunchError(f"ddp-launch is running in the batch script of a {slurm.num_nodes}-node job, so "
                          f"only one node would join: start it with srun (SLURM_STEP_ID is unset)")


def _head(slurm: SlurmEnv, options: LaunchOptions, facts: NodeFacts,
          is_head: bool) -> tuple[str, str | None, str]:
    """(rendezvous host, its IPv4 address when known, note): the override as given, or the first
    node's address, or its name; from the one lookup of the head questions() named (facts.head)."""
    multi = slurm.num_nodes > 1
    name = facts.head.asked.checked()
    address = facts.head.address
    if options.rdzv_host is not None:
        if multi and is_loopback(name):
            raise LaunchError(f"{options.rdzv_host.source}={name!r} is a loopback address on a "
                              f"{slurm.num_nodes}-node job: every node would rendezvous with itself; "
                              f"give the head node's routable name or address")
        return name, address, f"rendezvous host {name} from {options.rdzv_host.source}"
    if address is None:
        return name, None, f"head node {name} (first of {slurm.nodes_source}) did not resolve here: passing the name"
    if multi and is_loopback(address):
        if not is_head:
            raise LaunchError(f"head node {name!r} resolves to {address} (loopback) on this node: fix the "
                              f"name service (/etc/hosts) or pass --rdzv-host with the head's address")
        return name, address, f"head node {name} resolves to loopback {address} here: passing the name"
    return address, address, f"head node {name} (first of {slurm.nodes_source}) = {address}"


def _announcement(slurm: SlurmEnv, speaks: bool, head_note: str, port: int) -> str | None:
    """The head node and its address for the job output: one line per job, from the head (or rank 0)."""
    if not speaks or slurm.num_nodes < 2:
        return None
    return f"ddp-launch: job {slurm.job_id}, {slurm.num_nodes} nodes: {head_note}, port {port}"


def _port(slurm: SlurmEnv, options: LaunchOptions) -> tuple[int, str]:
    if options.rdzv_port is not None:
        return int(options.rdzv_port.value), f"port from {options.rdzv_port.source}"
    step = slurm.step_id or 0
    port = rendezvous_port(slurm.job_id, step)
    return port, f"port {port} = 20000 + (job {slurm.job_id} mod 1000) * 10 + (step {step} mod 10)"


# -- slurm-node ------------------------------------------------------------------------------

def _plan_node(slurm: SlurmEnv, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    _check_nodes(slurm, options)
    if not slurm.one_task_per_node():
        raise LaunchError(f"--mode slurm-node needs one task per node but {slurm.tasks_source or 'SLURM_NTASKS'} "
                          f"gives more: use srun --ntasks-per-node=1, or --mode slurm-task (one task per GPU)")
    index = slurm.this_node_index()
    if index is None and slurm.num_nodes > 1:
        raise LaunchError("SLURM_NODEID and SLURMD_NODENAME are unset, so this node cannot tell whether it "
                          "hosts the rendezvous: start ddp-launch with srun")
    is_head = index in (None, 0)
    host, address, head_note = _head(slurm, options, facts, is_head)
    port, port_note = _port(slurm, options)
    gpus_here = gpu_count.count_gpus(env, facts.gpu_device_files, slurm.accelerator, GPU_GRANT)
    workers = workers_per_node(options, None, gpus_here)
    run_id = f"{slurm.job_id}.{slurm.step_id or 0}"
    restarts = max_restarts(options)
    job_conf = job_rdzv_conf(env)
    argv = torchrun_command(facts.python, str(slurm.num_nodes), workers.count,
                            Rendezvous(host, port, run_id, is_head, join_timeout(options, job_conf), job_conf),
                            restarts, node_log_dir(options.log_dir, _node_name(slurm, index)),
                            options.workload)
    notes = (f"SLURM job {slurm.job_id}: {slurm.num_nodes} node(s), this is node {index if index is not None else 0}"
             + (" (rendezvous host)" if is_head else ""),
             head_note, port_note, *worker_notes(workers))
    node = slurm.node_name or (slurm.nodes[index] if index is not None else slurm.nodes[0])
    changes = (torchrun_env(env, restarts, options.log_dir, node, options.workload) + workers_env(workers, env, facts.cpu_count)
               + flight_recorder_env(env))
    return LaunchPlan("slurm-node", argv, changes, notes, slurm.num_nodes, Endpoint(host, port, address),
                      announcement=_announcement(slurm, is_head, head_note, port))


def _node_name(slurm: SlurmEnv, index: int | None) -> str | None:
    if slurm.num_nodes == 1:
        return None
    return slurm.node_name or (slurm.nodes[index] if index is not None else None)


# -- slurm-task ------------------------------------------------------------------------------

def _plan_task(slurm: SlurmEnv, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    _check_nodes(slurm, options)
    if options.nproc_per_node is not None or (options.cpu_workers and options.cpu_workers.source == "--cpu-workers"):
        raise LaunchError("--nproc-per-node/--cpu-workers conflict with --mode slurm-task, where each SLURM "
                          "task is one worker: set the count with srun --ntasks-per-node")
    for name, value in (("SLURM_PROCID", slurm.proc_id), ("SLURM_LOCALID", slurm.local_id),
                        ("SLURM_NTASKS", slurm.num_tasks)):
        if value is None:
            raise LaunchError(f"{name} is not set: --mode slurm-task runs one srun task per GPU; "
                              f"start ddp-launch with srun --ntasks-per-node=<GPUs per node>")
    local_world = slurm.tasks_here()
    if local_world is None:
        raise LaunchError("cannot tell how many tasks run on this node: SLURM_STEP_TASKS_PER_NODE, "
                          "SLURM_NTASKS_PER_NODE and SLURM_TASKS_PER_NODE are unset or uneven without SLURM_NODEID")
    host, address, head_note = _head(slurm, options, facts, slurm.this_node_index() == 0)
    port, port_note = _port(slurm, options)
    device = _task_device(env, slurm.local_id or 0, local_world, slurm.accelerator, options.workload)
    # torch's definitions (torchrun's environment variables, https://docs.pytorch.org/docs/stable/elastic/run.html):
    # LOCAL_RANK is the worker's index on its node, LOCAL_WORLD_SIZE the workers there, whatever GPUs it sees.
    changes = [
        EnvChange("RANK", str(slurm.proc_id), "SLURM_PROCID"),
        EnvChange("WORLD_SIZE", str(slurm.num_tasks), "tasks in this step"),
        EnvChange("LOCAL_RANK", str(slurm.local_id or 0), "SLURM_LOCALID"),
        EnvChange("LOCAL_WORLD_SIZE", str(local_world), "tasks on this node"),
        EnvChange("MASTER_ADDR", host, "rendezvous host (env:// init)"),
        EnvChange("MASTER_PORT", str(port), "derived from the job and step id"),
    ]
    if device is not None:
        changes.append(device)
    changes += _task_threads(env, slurm.cpus_per_task, facts.cpu_count, local_world)
    if "PYTHONUNBUFFERED" not in env:
        changes.append(EnvChange("PYTHONUNBUFFERED", "1", "srun reads output through pipes: lines appear as they happen"))
    changes += flight_recorder_env(env)
    notes = [f"SLURM job {slurm.job_id}: task {slurm.proc_id} of {slurm.num_tasks}, "
             f"{local_world} task(s) on this node", head_note, port_note]
    if options.max_restarts is not None and options.max_restarts.source == "--max-restarts":
        notes.append("--max-restarts is ignored in slurm-task mode (no torchrun restarts the tasks): a crash ends "
                     "the step, and a new run on the same --run-dir resumes from its checkpoint")
    if options.log_dir:
        notes.append("--log-dir is ignored in slurm-task mode (no torchrun): use srun --output")
    if options.rdzv_timeout is not None:
        notes.append(f"{options.rdzv_timeout.source} is ignored in slurm-task mode (no torchrun): "
                     f"the trainer's --dist-timeout-s bounds the wait for peers")
    return LaunchPlan("slurm-task", options.workload.direct_argv(facts.python), tuple(changes), tuple(notes),
                      slurm.num_nodes, Endpoint(host, port, address),
                      announcement=_announcement(slurm, slurm.proc_id == 0, head_note, port))


def _task_threads(env: Mapping[str, str], cpus_per_task: int | None, cpu_count: int,
                  tasks_here: int) -> tuple[EnvChange, ...]:
    """OMP_NUM_THREADS for one SLURM task (no torchrun): the task's CPUs, else a share of the node's."""
    if "OMP_NUM_THREADS" in env:
        return ()
    threads = cpus_per_task or max(1, cpu_count // tasks_here)
    return (EnvChange("OMP_NUM_THREADS", str(threads),
                      "unset; SLURM_CPUS_PER_TASK" if cpus_per_task
                      else f"unset; {cpu_count} CPUs / {tasks_here} tasks"),)


def _task_device(env: Mapping[str, str], local_id: int, local_world: int, accelerator: Accelerator,
                 workload: Workload) -> EnvChange | None:
    """Which of the GPUs a task sees is its own, where that is not its LOCAL_RANK: SLURM bound one
    GPU to it (--gpus-per-task=1, --gpu-bind), so it sees that one alone, as device 0.

    Our trainer and gate read that from DDP_TASK_DEVICE. A user's script picks its GPU from LOCAL_RANK
    (torch's DDP tutorials: torch.cuda.set_device(local_rank)) or SLURM_LOCALID, both this task's index on
    the node as torch and SLURM define them, which would name a device the task cannot see (or, taken
    modulo the GPUs seen, share one): the step stops here, every task alike, before any rank trains."""
    setting = gpu_count.visible_setting(env, accelerator)
    variable, visible = setting if setting is not None else (accelerator.visible_variables[0], None)
    seen = gpu_count.visible_devices(visible) if visible is not None else None
    if seen == 1 and local_world > 1:
        if not workload.is_ours:
            raise LaunchError(
                f"task {local_id} of this node sees one GPU ({variable}={visible}), its own, as device 0, while its "
                f"LOCAL_RANK and SLURM_LOCALID are {local_id} of {local_world}: a script that picks its GPU from "
                f"them (cuda:LOCAL_RANK) would not find it ({workload.describe()}); give every task the node's "
                f"GPUs (--gpus-per-node={local_world} or --gres=gpu:{local_world}, without --gpus-per-task or "
                f"--gpu-bind), as this project's job scripts ask")
        return EnvChange(TASK_DEVICE_VAR, "0", f"task {local_id} sees one GPU, its own ({variable}={visible}): "
                                               f"device 0 of those it sees, not its LOCAL_RANK")
    if seen is not None and 1 < seen < local_world:
        raise LaunchError(f"{local_world} tasks on this node but {variable}={visible!r} lists {seen} "
                          f"GPUs: request one GPU per task (--gpus-per-task=1 or --gpus-per-node={local_world})")
    return None
