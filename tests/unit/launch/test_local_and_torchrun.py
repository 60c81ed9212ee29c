"""No scheduler (local) and already inside torchrun: the two single-launcher modes."""

from __future__ import annotations

import pytest

from ddp_launch.errors import LaunchError
from launch_envs import PYTHON, env_of, plan_for

# What every plan adds where the user set nothing (ddp_launch/forensics.py).
FLIGHT_RECORDER_ON = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                      "TORCH_NCCL_ENABLE_MONITORING": "1"}


def test_local_mode_runs_standalone_torchrun_with_one_worker_per_gpu():
    plan = plan_for({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert plan.mode == "local"
    assert plan.argv == (PYTHON, "-m", "ddp_launch.agent", "--standalone", "--nnodes=1",
                         "--nproc-per-node=2", "--max-restarts=0", "-m", "ddp_launch.worker", "-m", "ddp_train")
    assert plan.nodes == 1


def test_local_mode_counts_device_files_when_nothing_else_says():
    assert "--nproc-per-node=4" in plan_for({}, cpu_count=8, gpu_device_files=4).argv


def test_make_demo_command_plans_two_cpu_workers():
    plan = plan_for({}, "--mode", "local", "--cpu-workers", "2", "--", "--demo", "--data-dir", "data")
    assert plan.argv[3:] == ("--standalone", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=0",
                             "-m", "ddp_launch.worker", "-m", "ddp_train", "--demo", "--data-dir", "data")
    assert env_of(plan) == {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "36", **FLIGHT_RECORDER_ON}


def test_cpu_workers_from_the_environment():
    assert "--nproc-per-node=3" in plan_for({"DDP_LAUNCH_CPU_WORKERS": "3"}).argv


def test_nproc_flag_beats_cpu_workers_from_the_environment():
    plan = plan_for({"DDP_LAUNCH_CPU_WORKERS": "3"}, "--nproc-per-node", "2")
    assert "--nproc-per-node=2" in plan.argv and "CUDA_VISIBLE_DEVICES" not in env_of(plan)


def test_local_mode_with_several_nodes_is_an_error():
    with pytest.raises(LaunchError, match="--nodes 2 but no scheduler was found"):
        plan_for({}, "--nodes", "2")


def test_module_workload():
    assert plan_for({}, "--module", "my.pkg").argv[-2:] == ("-m", "my.pkg")


def test_script_workload_is_torchruns_positional_script():
    assert plan_for({}, "--script", "w.py", "--", "-x").argv[-2:] == ("w.py", "-x")


def test_inside_torchrun_the_workload_runs_directly_never_nested():
    env = {"TORCHELASTIC_RUN_ID": "abc", "RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "10.0.0.1", "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "a"}
    plan = plan_for(env, "--", "--epochs", "1")
    assert plan.mode == "torchrun"
    assert plan.argv == (PYTHON, "-m", "ddp_launch.worker", "-m", "ddp_train", "--epochs", "1")
    assert env_of(plan) == {}  # the launcher changes nothing of what torchrun set
    assert (plan.nodes, plan.rendezvous.host) == (2, "10.0.0.1")


@pytest.mark.parametrize("args", [
    ("a b", "it's", 'say "hi"', "$HOME", "`id`", "*", "", "--", "-m", "ünïcode", "x;rm -rf /"),
])
def test_workload_arguments_reach_argv_unchanged(args):
    for env in ({}, {"TORCHELASTIC_RUN_ID": "x"}):
        plan = plan_for(env, "--", *args)
        assert plan.argv[-len(args):] == args


def test_local_log_dir_is_used_as_given():
    argv = plan_for({}, "--mode", "local", "--cpu-workers", "1", "--log-dir", "logs").argv
    assert "--log-dir=logs" in argv and "--tee=3" in argv
