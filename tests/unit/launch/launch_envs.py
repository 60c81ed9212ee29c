"""The exact scheduler environments of the reference setups (Sigma2's Olivia guide, the MPCDF
Raven tutorial, EPFL RCP's RunAI guide, a plain-Ethernet cluster) as plain dicts, and plan_for() to plan from them.

Nothing here touches os.environ or the node: facts are built by hand, a fake name service
stands in for getaddrinfo.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Optional

from ddp_launch import planner
from ddp_launch.fabric.defaults import read_fabric_data
from ddp_launch.facts import NodeFacts, Resolved, look_up_peer
from ddp_launch.options import read_options
from ddp_launch.plan import LAUNCHER

PYTHON = "/usr/bin/python3"

# Name service of the fake clusters: what getaddrinfo would answer.
HOSTS = {
    "olivia-gh001": "10.10.0.1",
    "olivia-gh002": "10.10.0.2",
    "raven0123": "10.20.0.123",
    "raven0124": "10.20.0.124",
    "master-node": "192.168.20.15",
    "job-master-0": "10.96.0.10",
    "trainjob-node-0-0.trainjob": "10.96.0.20",
    "nid005000": "10.30.0.50",
    "nid005001": "10.30.0.51",
    "elastic-job-worker-0": "10.96.0.30",
}


def fake_resolver(table: Mapping[str, str] = HOSTS):
    """Like rendezvous.lookup_ipv4: IPv4 literals answer themselves, names come from table."""
    def resolve(host: str) -> Optional[str]:
        if host.replace(".", "").isdigit() and host.count(".") == 3:
            return host
        return table.get(host)
    return resolve


def launch_of(env: Mapping[str, str], *argv: str) -> planner.Launch:
    """ddp-launch's argv and env, read once as cli.launch reads them (planner.parse), with the
    site profile and fabric defaults read from the repository's containers/sites."""
    options = read_options(list(argv), env)
    return planner.parse(options, env, read_fabric_data(options.site, env))


def questions_for(env: Mapping[str, str], *argv: str):
    """What the planner asks this node for argv and env."""
    return planner.questions(launch_of(env, *argv))


def looked_up(asked, resolve=None):
    """The probe's Resolved for the asked head, answered from the fake name table (or resolve)."""
    if asked.head is None:
        return None
    address = (resolve or fake_resolver())(asked.head.name) if asked.head.problem is None else None
    return Resolved(asked.head, address)


def facts_for(env: Mapping[str, str], *argv: str, resolve=None, **fields) -> NodeFacts:
    """This test machine's facts, built by hand: 72 CPUs, no GPU device files, the head name
    the planner asks about answered from the fake name table (and the other node it names, as
    the probe asks it), the --script present."""
    asked = questions_for(env, *argv)
    head = looked_up(asked, resolve)
    made = {"python": PYTHON, "cpu_count": 72, "head": head,
            "peer": look_up_peer(head, asked.peer, resolve or fake_resolver()),
            "existing_files": frozenset(asked.files), "readable_files": frozenset(asked.files), **fields}
    return NodeFacts(**made)


def plan_for(env: Mapping[str, str], *argv: str, resolve=None, **facts_fields):
    """The LaunchPlan exactly as cli.main builds it (fabric included), without I/O or exec."""
    return planner.plan(launch_of(env, *argv), facts_for(env, *argv, resolve=resolve, **facts_fields))


def plan_on_tree(env: Mapping[str, str], root, *argv: str, machine: str = "x86_64"):
    """The LaunchPlan as cli.main builds it, with the node probed from a fake tree under root
    (/dev, /sys, the container's bound directories), as the fabric tests probe one.

    The node's devices, interfaces and directories come from the tree; what would vary from
    machine to machine is fixed as facts_for fixes it: the interpreter, 72 CPUs, the working
    directory, the architecture, and the head's address from the fake name table.
    """
    launch = launch_of(env, *argv)
    asked = planner.questions(launch)
    probed = planner.probe(replace(asked, head=None), str(root))
    facts = replace(probed, python=PYTHON, cpu_count=72, cwd="/", machine=machine, head=looked_up(asked))
    return planner.plan(launch, facts)


def env_of(plan) -> dict:
    """The variables the scheduler's plan and ours set (not the fabric's)."""
    return {change.name: change.value for change in plan.changes if change.origin == LAUNCHER}


# Olivia (Sigma2's Olivia guide): sbatch --nodes=2 --ntasks-per-node=1 --gpus-per-node=4, srun.
OLIVIA_STEP = {
    "SLURM_JOB_ID": "771234",
    "SLURM_JOB_NODELIST": "olivia-gh[001-002]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_GPUS_PER_NODE": "4",
    "SLURM_CPUS_PER_TASK": "72",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "olivia-gh[001-002]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_GPUS_ON_NODE": "4",
}


def olivia(node: int) -> dict:
    return {**OLIVIA_STEP, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": f"olivia-gh00{node + 1}"}


# Raven (MPCDF tutorial, github.com/mvigl/MPCDF_tutorial, docs/05_multi_node.md):
# --nodes=2 --ntasks-per-node=4 --gres=gpu:a100:4, srun python ...
RAVEN_STEP = {
    "SLURM_JOB_ID": "5550017",
    "SLURM_JOB_NODELIST": "raven[0123,0124]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NTASKS": "8",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_TASKS_PER_NODE": "4(x2)",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "raven[0123,0124]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_GPUS_ON_NODE": "4",
    "SLURM_CPUS_PER_TASK": "18",
}


def raven(rank: int, tasks_per_node: int = 4, **extra: str) -> dict:
    node = rank // tasks_per_node
    return {**RAVEN_STEP, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % tasks_per_node),
            "SLURM_NODEID": str(node), "SLURMD_NODENAME": f"raven012{node + 3}", **extra}


# LUMI-G (LUMI-AI-Guide 05-multi-gpu-and-node, run_ddp_torchrun_4.sh): --nodes=2
# --ntasks-per-node=1 --gpus-per-node=8 (8 MI250X GCDs a node), srun; SLURM names the GCDs
# to ROCm in ROCR_VISIBLE_DEVICES (gres.conf(5)).
LUMI_STEP = {
    "SLURM_JOB_ID": "8123456",
    "SLURM_JOB_NODELIST": "nid[005000-005001]",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_GPUS_PER_NODE": "8",
    "SLURM_CPUS_PER_TASK": "56",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "nid[005000-005001]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_GPUS_ON_NODE": "8",
    "ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}


def lumi(node: int, **extra: str) -> dict:
    return {**LUMI_STEP, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": f"nid00500{node}", **extra}


# slurm/lumi-multinode.sh (the AI Guide's run_ddp_srun_4.sh): --nodes=2 --ntasks-per-node=8
# --cpus-per-task=7 --gpus-per-node=8, one task per GCD; every task sees the node's 8 GCDs.
LUMI_TASK_STEP = {**LUMI_STEP, "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8", "SLURM_TASKS_PER_NODE": "8(x2)",
                  "SLURM_CPUS_PER_TASK": "7", "SLURM_STEP_NUM_TASKS": "16", "SLURM_STEP_TASKS_PER_NODE": "8(x2)"}


def lumi_task(rank: int, tasks_per_node: int = 8) -> dict:
    node = rank // tasks_per_node
    return {**LUMI_TASK_STEP, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % tasks_per_node),
            "SLURM_NODEID": str(node), "SLURMD_NODENAME": f"nid00500{node}"}


# A plain-Ethernet cluster: 6 nodes x 1 GPU (master-node, node01-05), --ntasks-per-node=1
# --gpus-per-node=1, explicit --nodelist.
SIX_NODE_ETHERNET_STEP = {
    "SLURM_JOB_ID": "908",
    "SLURM_JOB_NODELIST": "master-node,node[01-05]",
    "SLURM_JOB_NUM_NODES": "6",
    "SLURM_NTASKS": "6",
    "SLURM_TASKS_PER_NODE": "1(x6)",
    "SLURM_GPUS_PER_NODE": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "master-node,node[01-05]",
    "SLURM_STEP_NUM_NODES": "6",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_STEP_TASKS_PER_NODE": "1(x6)",
    "SLURM_GPUS_ON_NODE": "1",
}


def six_node_ethernet(node: int) -> dict:
    names = ["master-node", "node01", "node02", "node03", "node04", "node05"]
    return {**SIX_NODE_ETHERNET_STEP, "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
            "SLURMD_NODENAME": names[node]}


# RunAI (EPFL RCP, github.com/epfml/getting-started, docs/multinode.md):
# runai submit-dist pytorch --workers=1 -g 4 -> 2 pods x 4 GPUs.
def runai(pod: int) -> dict:
    return {
        "PET_NNODES": "2",
        "RUNAI_NUM_OF_GPUS": "4",
        "WORLD_SIZE": "8",
        "RANK": str(pod),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "10.96.0.10",
        "MASTER_PORT": "23456",
    }


# Kubeflow training-operator v1 PyTorchJob (Master + 1 Worker, nprocPerNode 4).
def kubeflow_v1(replica: int) -> dict:
    return {
        "MASTER_ADDR": "job-master-0", "PET_MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456", "PET_MASTER_PORT": "23456",
        "WORLD_SIZE": "8", "RANK": str(replica), "PET_NODE_RANK": str(replica),
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PYTHONUNBUFFERED": "1",
    }


# Kubeflow training-operator v1 elastic PyTorchJob (elasticPolicy minReplicas 2, maxReplicas 4,
# maxRestarts 100; Worker replicas only, port 23456): what elastic.go gives every pod. No rank and
# no MASTER_*: the pod named in the endpoint, <job>-worker-0, hosts torchrun's c10d rendezvous.
def kubeflow_elastic(pod: int) -> tuple[dict, str]:
    """(the pod's environment, its hostname: the pod's name)."""
    return {
        "PET_RDZV_ENDPOINT": "elastic-job-worker-0:23456", "PET_RDZV_BACKEND": "c10d",
        "PET_NNODES": "2:4", "PET_MAX_RESTARTS": "100", "PYTHONUNBUFFERED": "0",
    }, f"elastic-job-worker-{pod}"


# Kubeflow Trainer v2 TrainJob: PET_* only.
def trainer_v2(node: int) -> dict:
    return {
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": "trainjob-node-0-0.trainjob", "PET_MASTER_PORT": "29400",
    }
