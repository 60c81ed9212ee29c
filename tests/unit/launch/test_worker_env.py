"""A worker's ranks agree whichever variables its workload reads: SLURM's task variables in a torchrun
worker are its own (ddp_launch/worker_env.py), and a MASTER_ADDR the workload sets must name rank 0's node."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddp_launch import worker_env
from ddp_launch.worker_env import disagreement, master_addr_problem, scheduler_variables_for_worker

# What srun set for the one task that runs torchrun on the second of two nodes (--ntasks-per-node=1), and
# what torchrun set for the second of that node's two workers.
SRUN_NODE_TASK = {"SLURM_JOB_ID": "42", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NTASKS": "2",
                  "SLURM_NPROCS": "2", "SLURM_NODEID": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)",
                  "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_GTIDS": "1",
                  "SLURMD_NODENAME": "node2", "SLURM_STEP_NODELIST": "node[1-2]"}
TORCHRUN_WORKER = {"TORCHELASTIC_RUN_ID": "42.0", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                   "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2"}


def test_a_torchrun_workers_slurm_task_variables_become_its_own_place_in_the_world():
    changes, problem = scheduler_variables_for_worker({**SRUN_NODE_TASK, **TORCHRUN_WORKER})
    assert problem is None
    assert changes == {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
                       "SLURM_NODEID": "1", "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
                       "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_GTIDS": "2,3"}
    # The node's name, its node list and the job stay SLURM's: they are true for every worker.
    assert not {"SLURMD_NODENAME", "SLURM_STEP_NODELIST", "SLURM_JOB_ID"} & set(changes)


def test_only_the_variables_slurm_set_are_set_and_nothing_outside_a_torchrun_worker_or_slurm():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", **TORCHRUN_WORKER}
    assert scheduler_variables_for_worker(env) == ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, None)
    assert scheduler_variables_for_worker(TORCHRUN_WORKER) == ({}, None)           # a pod, a laptop
    no_torchrun = {k: v for k, v in TORCHRUN_WORKER.items() if k != "TORCHELASTIC_RUN_ID"}
    assert scheduler_variables_for_worker({**SRUN_NODE_TASK, **no_torchrun}) == ({}, None)


def test_an_uneven_world_cannot_say_slurms_tasks_per_node_and_stops_in_one_line():
    uneven = {**SRUN_NODE_TASK, **TORCHRUN_WORKER, "WORLD_SIZE": "5"}
    changes, problem = scheduler_variables_for_worker(uneven)
    assert changes == {}
    assert problem.startswith("SLURM_TASKS_PER_NODE='1(x2)' cannot be said for this worker: torchrun's WORLD_SIZE=5 "
                              "is not LOCAL_WORLD_SIZE=2 on each of GROUP_WORLD_SIZE=2 nodes")


def test_one_srun_task_per_worker_agrees_by_construction_and_a_rank_set_beside_it_is_named():
    task = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}
    assert disagreement({**task, "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) is None
    assert disagreement({**task, "RANK": "0", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}) == (
        "RANK=0 but SLURM_PROCID=5: a script that reads either would take another rank than its peers; start the "
        "workload with ddp-launch in the task (it sets RANK from SLURM_PROCID), or unset RANK")


# A name service of two nodes, as a node of the Ethernet cluster's sees it: its own name answers the
# loopback line of Debian's /etc/hosts (127.0.1.1) besides its address.
NAMES = {"master-node": {"10.0.0.1"}, "node01": {"10.0.0.2"}, "localhost": {"127.0.0.1"}, "10.0.0.1": {"10.0.0.1"}}


def resolver(me: str):
    """The name service as node `me` answers it: its own name first to Debian's 127.0.1.1 line."""
    def resolve(name: str) -> set:
        name = me if name == "<me>" else name
        return NAMES.get(name, set()) | ({"127.0.1.1"} if name == me else set())
    return resolve


TWO_NODES = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "master-node"}


def test_a_master_addr_that_names_rank_0s_node_is_the_workloads_to_set(monkeypatch):
    monkeypatch.setattr(worker_env.socket, "gethostname", lambda: "<me>")
    on_head = resolver("master-node")
    assert master_addr_problem("master-node", TWO_NODES, on_head) is None
    assert master_addr_problem("10.0.0.1", TWO_NODES, on_head) is None           # its address
    assert master_addr_problem("localhost", TWO_NODES, on_head) is None          # loopback, on the head itself
    assert master_addr_problem("10.0.0.1", TWO_NODES, resolver("node01")) is None
    # One node is the whole world: rank 0 runs here, any of its names reaches it.
    assert master_addr_problem("localhost", {**TWO_NODES, "WORLD_SIZE": "2"}, resolver("node01")) is None


def test_a_master_addr_of_another_node_stops_the_workload_in_one_line(monkeypatch):
    monkeypatch.setattr(worker_env.socket, "gethostname", lambda: "<me>")
    problem = master_addr_problem("node01", TWO_NODES, resolver("master-node"))
    assert problem == ("the workload set MASTER_ADDR=node01, but rank 0 hosts this job's rendezvous on master-node "
                       "(ddp-launch's MASTER_ADDR; torchrun orders the nodes by host name): every rank would wait for "
                       "a store nobody hosts there until its timeout; leave MASTER_ADDR to ddp-launch (env:// reads "
                       "it), or set it only where it is unset (os.environ.setdefault)")
    # localhost on another node than rank 0's, and a name that does not resolve.
    assert master_addr_problem("localhost", TWO_NODES, resolver("node01")) is not None
    assert master_addr_problem("no-such-host", TWO_NODES, resolver("node01")) is not None


GUARDED = """
import os, sys
from ddp_launch import worker_env
worker_env.guard_master_addr(os.environ, lambda line: print("said: " + line, file=sys.stderr), 2)
os.environ["MASTER_ADDR"] = sys.argv[1]
print("set", os.environ["MASTER_ADDR"])
"""


@pytest.mark.parametrize(("value", "code"), [("127.0.0.1", 0), ("192.0.2.1", 2)])
def test_the_audit_hook_judges_the_assignment_itself_as_the_workload_makes_it(value, code):
    env = {**os.environ, "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "localhost"}
    done = subprocess.run([sys.executable, "-c", GUARDED, value], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    if code:
        assert done.stdout == "" and done.stderr.startswith("said: the workload set MASTER_ADDR=192.0.2.1, but rank 0")
        assert "Traceback" not in done.stderr
    else:
        assert done.stdout == f"set {value}\n"
