"""Each scheduler's job identity, exported as DDP_JOB_ID and DDP_NODE_NAME, and what the run-dir lock makes of it.

A pod knows no restart count (the Downward API has no field for it: Kubernetes, "Downward API",
Available fields), but a container restarted in its pod keeps the pod's name, which is its host
name (Kubernetes, "Container Environment"), and the workload's variables: the identity must come
out the same there, and the lock its predecessor left must not stand in its way.
"""

from __future__ import annotations

import pytest

from ddp_contract import rundir_lock
from ddp_contract.rundir_lock import Owner, decide
from launch_envs import env_of, kubeflow_elastic, kubeflow_v1, olivia, plan_for, raven, runai, trainer_v2

# Run:ai's built-in variables (NVIDIA Run:ai docs, "Workloads", Built-in Workload Environment Variables).
UUID = "6fb7f0fa-3c2e-4b8a-9d41-0f2a5c7e9b13"
RUNAI_WORKLOAD = {"RUNAI_JOB_NAME": "ddp-train-20260101-120000", "RUNAI_JOB_UUID": UUID, "RUNAI_PROJECT": "mlo-alice"}


def identity(env: dict, *argv: str, hostname: str = "") -> tuple:
    planned = env_of(plan_for(env, *argv, hostname=hostname))
    return planned.get("DDP_JOB_ID"), planned.get("DDP_NODE_NAME")


def test_every_pod_of_a_runai_workload_names_the_same_job_and_its_own_pod():
    master = identity({**runai(0), **RUNAI_WORKLOAD}, hostname="ddp-train-20260101-120000-master-0")
    worker = identity({**runai(1), **RUNAI_WORKLOAD}, hostname="ddp-train-20260101-120000-worker-0")
    assert master == (f"ddp-train-20260101-120000/{UUID}", "ddp-train-20260101-120000-master-0")
    assert worker == (f"ddp-train-20260101-120000/{UUID}", "ddp-train-20260101-120000-worker-0")


def test_older_runai_clusters_name_the_workload_without_their_prefix():
    # docs.run.ai v2.16, "Environment Variables inside a Run:ai Workload": JOB_NAME and JOB_UUID.
    assert identity({**runai(0), "JOB_NAME": "wrn", "JOB_UUID": UUID}, hostname="wrn-master-0") == (
        f"wrn/{UUID}", "wrn-master-0")


@pytest.mark.parametrize("env, hostname, job", [
    # The operator's pod names (training-operator v1, genGeneralName: <job>-<rtype>-<index>).
    (kubeflow_v1(1), "job-worker-0", "job"),
    # Trainer v2: PET_MASTER_ADDR=<trainjob>-node-0-0.<trainjob>.
    (trainer_v2(1), "trainjob-node-0-1", "trainjob"),
    # An elastic job: the endpoint names <job>-worker-0.
    (kubeflow_elastic(1)[0], kubeflow_elastic(1)[1], "elastic-job"),
])
def test_a_pytorchjob_is_named_by_its_operators_pod_names(env, hostname, job):
    assert identity(env, hostname=hostname) == (job, hostname)


def test_a_pod_whose_job_says_no_name_is_named_by_itself():
    # RunAI's MASTER_ADDR is the master pod's IP: no job name in it; the pod's own name survives its restarts.
    assert identity(runai(1), hostname="p-worker-0") == ("pod p-worker-0", "p-worker-0")


def test_a_slurm_job_is_named_by_its_job_id_as_the_job_script_names_it():
    assert identity(olivia(1)) == ("771234", "olivia-gh002")
    assert identity(raven(5)) == ("5550017", "raven0124")  # slurm-task: the same job on every task


def test_a_users_job_id_is_kept_and_a_local_run_names_only_its_host():
    assert identity({**runai(0), **RUNAI_WORKLOAD, "DDP_JOB_ID": "mine"}, hostname="h")[0] is None  # kept, not set
    assert identity({}, hostname="laptop.example.org") == (None, "laptop")


def test_inside_torchrun_the_outer_launchs_identity_passes_through():
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "1", "DDP_JOB_ID": "771234"}
    assert identity(env, hostname="h") == (None, None)


def test_a_restarted_container_takes_over_the_lock_its_predecessor_left_in_the_same_pod():
    """The pod keeps its name and its workload; its new container starts PID 1 again, so the old
    owner's pid (1) is alive here, as another process of another PID namespace."""
    env = {**runai(0), **RUNAI_WORKLOAD}
    pod = "ddp-train-20260101-120000-master-0"
    workers_env = plan_for(env, hostname=pod).environment(env)
    me = rundir_lock.owner_here(workers_env, pid=1)._replace(host=pod, pid_space="boot/2000")
    left = Owner(me.job, pod, 1, "boot/1000")
    assert decide(left, 5.0, me, pid_alive=True) is None
    # Another workload's fresh lock in that run dir still stops it.
    assert decide(left._replace(job=f"other/{UUID}"), 5.0, me, pid_alive=True) is not None
