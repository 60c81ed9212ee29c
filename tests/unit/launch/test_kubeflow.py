"""RunAI and Kubeflow pods: torchrun per pod, c10d at the master, pod-level ranks removed."""

from __future__ import annotations

import pytest

from ddp_launch.errors import LaunchError
from ddp_launch.schedulers import kubeflow, local, scheduler_for, slurm, torchrun
from ddp_launch.rendezvous import waiting_resolver
from launch_envs import (PYTHON, fake_resolver, kubeflow_elastic, kubeflow_v1, olivia, plan_for, questions_for, runai,
                         trainer_v2)


def test_runai_master_pod_hosts_the_rendezvous():
    plan = plan_for(runai(0))
    assert plan.mode == "kubeflow"
    assert plan.argv == (
        PYTHON, "-m", "ddp_launch.agent", "--nnodes=2", "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.96.0.10:23456", "--rdzv-id=10.96.0.10",
        "--rdzv-conf=is_host=true,read_timeout=300", "--nproc-per-node=4", "--max-restarts=0",
        "-m", "ddp_launch.worker", "-m", "ddp_train")
    assert plan.nodes == 2


def test_a_runai_pod_without_gpus_runs_one_cpu_worker_not_torchruns_zero():
    plan = plan_for({**runai(0), "RUNAI_NUM_OF_GPUS": "0"})
    assert "--nproc-per-node=1" in plan.argv and "--nproc-per-node=0" not in plan.argv


def test_runai_worker_pod_joins_and_pod_level_ranks_are_removed():
    plan = plan_for(runai(1))
    assert "--rdzv-conf=is_host=false,read_timeout=300" in plan.argv
    removed = {c.name for c in plan.changes if c.value is None}
    assert removed == {"RANK", "WORLD_SIZE", "LOCAL_RANK"}
    assert "RANK" not in plan.environment(runai(1)) and "WORLD_SIZE" not in plan.environment(runai(1))


@pytest.mark.parametrize("env", [kubeflow_v1(1), trainer_v2(1)], ids=["pytorchjob", "trainjob"])
def test_the_operators_pod_rank_does_not_reach_torchrun_which_would_warn_of_it(env):
    # torchrun reads PET_NODE_RANK as --node-rank and warns "node_rank is only used for static rdzv_backend"
    # in every pod but rank 0's; the c10d rendezvous numbers the pods itself.
    plan = plan_for(env)
    assert "PET_NODE_RANK" not in plan.environment(env) and "--rdzv-backend=c10d" in plan.argv
    assert not any(word.startswith("--node-rank") for word in plan.argv)


def test_kubeflow_v1_resolves_the_master_service_name():
    plan = plan_for(kubeflow_v1(1))
    assert "--rdzv-endpoint=10.96.0.10:23456" in plan.argv
    assert "--rdzv-id=job-master-0" in plan.argv and "--nproc-per-node=4" in plan.argv
    assert plan.rendezvous.host == "10.96.0.10"


def test_trainer_v2_uses_pet_variables_only():
    plan = plan_for(trainer_v2(0))
    assert {"--nnodes=2", "--nproc-per-node=4", "--rdzv-endpoint=10.96.0.20:29400",
            "--rdzv-conf=is_host=true,read_timeout=300"} <= set(plan.argv)
    # Nothing pod-level to remove but the pod's rank, which torchrun would take for a static rendezvous's.
    assert [c.name for c in plan.changes if c.value is None] == ["PET_NODE_RANK"]


def test_v1_master_with_localhost_address_is_fine_on_rank_zero():
    plan = plan_for({**kubeflow_v1(0), "MASTER_ADDR": "localhost", "PET_MASTER_ADDR": "localhost"},
                       resolve=fake_resolver({"localhost": "127.0.0.1"}))
    assert "--rdzv-endpoint=127.0.0.1:23456" in plan.argv


def test_loopback_master_on_a_worker_pod_is_an_error():
    env = {**kubeflow_v1(1), "PET_MASTER_ADDR": "localhost"}
    with pytest.raises(LaunchError, match="PET_MASTER_ADDR='localhost' is a loopback address on pod rank 1"):
        plan_for(env, resolve=fake_resolver({"localhost": "127.0.0.1"}))


def test_elastic_node_range_passes_through():
    plan = plan_for({**trainer_v2(1), "PET_NNODES": "1:4"})
    assert "--nnodes=1:4" in plan.argv and plan.nodes == 4


@pytest.mark.parametrize("value", ["two", "0", "4:", "1:2:3"])
def test_bad_pet_nnodes_is_an_error(value):
    with pytest.raises(LaunchError, match=f"PET_NNODES={value!r}"):
        plan_for({**trainer_v2(0), "PET_NNODES": value})


def test_missing_master_address_is_an_error():
    env = {k: v for k, v in trainer_v2(0).items() if k != "PET_MASTER_ADDR"}
    env["PET_NNODES"] = "2"
    with pytest.raises(LaunchError, match="PET_MASTER_ADDR or MASTER_ADDR is not"):
        plan_for(env, "--mode", "kubeflow")


def test_missing_node_rank_on_a_multi_pod_job_is_an_error():
    env = {k: v for k, v in trainer_v2(1).items() if k != "PET_NODE_RANK"}
    with pytest.raises(LaunchError, match="PET_NODE_RANK and RANK are unset"):
        plan_for(env)


def test_nodes_flag_checked_against_pod_count():
    with pytest.raises(LaunchError, match="--nodes 3 but PET_NNODES=2"):
        plan_for(runai(0), "--nodes", "3")


def test_pet_max_restarts_used_unless_the_flag_says_otherwise():
    env = {**trainer_v2(0), "PET_MAX_RESTARTS": "2"}
    assert "--max-restarts=2" in plan_for(env).argv
    assert "--max-restarts=0" in plan_for(env, "--max-restarts", "0").argv


def test_detection_order_torchrun_then_slurm_then_kubeflow_then_local():
    in_torchrun = {**runai(0), "TORCHELASTIC_RUN_ID": "x", "SLURM_JOB_ID": "1"}
    in_slurm = {**runai(0), "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "a"}
    no_scheduler = {"MASTER_ADDR": "x", "RANK": "0"}
    assert scheduler_for("auto", in_torchrun) is torchrun and plan_for(in_torchrun).mode == "torchrun"
    assert scheduler_for("auto", in_slurm) is slurm and plan_for(in_slurm).mode == "slurm-node"
    assert scheduler_for("auto", runai(0)) is kubeflow and plan_for(runai(0)).mode == "kubeflow"
    assert scheduler_for("auto", no_scheduler) is local and plan_for(no_scheduler).mode == "local"


# -- the bounded DNS wait ---------------------------------------------------------------------------

class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_dns_wait_retries_until_the_name_appears_and_reports_progress():
    clock, lines, answers = FakeClock(), [], iter([None] * 7 + ["10.96.0.10"])
    resolve = waiting_resolver(120, lines.append, lookup=lambda host: next(answers),
                               sleep=clock.sleep, clock=clock)
    assert resolve("job-master-0") == "10.96.0.10"
    assert clock.now == 14.0
    assert lines and all("waiting for 'job-master-0' to resolve" in line for line in lines)
    assert len(lines) == 2  # at 0 s and at 10 s, not on every try


def test_dns_wait_gives_up_after_its_bound_with_a_fix_in_the_message():
    clock = FakeClock()
    resolve = waiting_resolver(30, lambda line: None, lookup=lambda host: None,
                               sleep=clock.sleep, clock=clock)
    with pytest.raises(LaunchError, match="did not resolve within 30 s.*DDP_LAUNCH_DNS_TIMEOUT"):
        resolve("job-master-0")
    assert 30 <= clock.now <= 32


def test_each_pod_logs_under_its_own_rank_and_a_single_pod_job_under_the_dir_itself():
    assert "--log-dir=/runs/logs/pod1" in plan_for(runai(1), "--log-dir", "/runs/logs").argv
    single = {**runai(0), "PET_NNODES": "1"}
    assert "--log-dir=/runs/logs" in plan_for(single, "--log-dir", "/runs/logs").argv


# -- an elastic PyTorchJob (kubeflow/training-operator pkg/controller.v1/pytorch/elastic.go) --------

def test_an_elastic_worker_pod_without_a_rank_joins_the_endpoints_rendezvous():
    env, hostname = kubeflow_elastic(2)
    plan = plan_for(env, hostname=hostname)
    assert plan.argv[3:9] == (
        "--nnodes=2:4", "--rdzv-backend=c10d", "--rdzv-endpoint=10.96.0.30:23456",
        "--rdzv-id=elastic-job-worker-0", "--rdzv-conf=is_host=false,read_timeout=300", "--nproc-per-node=1")
    assert "--max-restarts=100" in plan.argv and plan.nodes == 4
    assert plan.notes[0] == "pod elastic-job-worker-2 of 2:4 (elastic: torchrun's rendezvous numbers the pods)"
    assert plan.announcement.startswith("ddp-launch: pod elastic-job-worker-2 of 2:4 (elastic: torchrun's rendezvous "
                                        "numbers the pods) joins the rendezvous (rendezvous host elastic-job-worker-0 "
                                        "(PET_RDZV_ENDPOINT) = 10.96.0.30, port 23456) with 1 worker(s)")


def test_the_pod_the_endpoint_names_hosts_the_rendezvous_and_announces_it():
    env, hostname = kubeflow_elastic(0)
    plan = plan_for(env, hostname=hostname)
    assert "--rdzv-conf=is_host=true,read_timeout=300" in plan.argv
    assert plan.announcement == ("ddp-launch: 4 pods: rendezvous host elastic-job-worker-0 (PET_RDZV_ENDPOINT) = "
                                 "10.96.0.30, port 23456")


def test_an_elastic_job_with_a_master_replica_meets_at_the_endpoint_not_at_rank_0():
    # elasticPolicy beside a Master replica: MASTER_ADDR and RANK too, but torchrun's c10d
    # meets at PET_RDZV_ENDPOINT (worker-0), which the master pod (RANK 0) does not host.
    env, _ = kubeflow_elastic(0)
    master = {**env, "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "RANK": "0", "WORLD_SIZE": "3"}
    plan = plan_for(master, hostname="elastic-job-master-0")
    assert "--rdzv-endpoint=10.96.0.30:23456" in plan.argv
    assert "--rdzv-conf=is_host=false,read_timeout=300" in plan.argv


def test_an_elastic_endpoint_given_as_an_address_leaves_is_host_to_torchrun():
    env, hostname = kubeflow_elastic(1)
    plan = plan_for({**env, "PET_RDZV_ENDPOINT": "10.96.0.30:23456"}, hostname=hostname)
    assert "--rdzv-conf=read_timeout=300" in plan.argv
    assert "torchrun's to tell" in plan.notes[0]


def test_an_endpoint_without_a_port_takes_torchruns_c10d_default():
    env, hostname = kubeflow_elastic(1)
    plan = plan_for({**env, "PET_RDZV_ENDPOINT": "elastic-job-worker-0"}, hostname=hostname)
    assert "--rdzv-endpoint=10.96.0.30:29400" in plan.argv


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("PET_RDZV_BACKEND", "etcd-v2", "PET_RDZV_BACKEND='etcd-v2': ddp-launch runs torchrun's c10d rendezvous only"),
    ("PET_RDZV_ENDPOINT", ":23456", "PET_RDZV_ENDPOINT=':23456' names no host"),
    ("PET_RDZV_ENDPOINT", "host:port", "PET_RDZV_ENDPOINT port='port' is not a TCP port"),
    ("PET_RDZV_CONF", "join_timeout", "PET_RDZV_CONF='join_timeout' is not key=value,key=value"),
    ("PET_RDZV_CONF", "join_timeout=soon", "PET_RDZV_CONF join_timeout='soon' is not a positive integer"),
])
def test_an_elastic_setting_torchrun_would_refuse_is_one_line(variable, value, message):
    env, hostname = kubeflow_elastic(1)
    with pytest.raises(LaunchError) as error:
        plan_for({**env, variable: value}, hostname=hostname)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


# torchrun takes PET_RDZV_CONF only when --rdzv-conf is not given (argparse_util.env: the flag beats
# PET_*), and ddp-launch always gives it: the job's keys are merged in, not lost.
def test_the_jobs_rdzv_conf_is_merged_into_the_flag_keeping_its_join_timeout():
    env, hostname = kubeflow_elastic(1)
    env = {**env, "PET_RDZV_CONF": "join_timeout=1800,last_call_timeout=30,is_host=true"}
    conf = [a for a in plan_for(env, hostname=hostname).argv if a.startswith("--rdzv-conf=")]
    assert conf == ["--rdzv-conf=is_host=false,read_timeout=900,join_timeout=1800,last_call_timeout=30"]


def test_rdzv_timeout_beats_the_jobs_join_timeout_and_the_jobs_read_timeout_is_kept():
    env, hostname = kubeflow_elastic(1)
    env = {**env, "PET_RDZV_CONF": "join_timeout=1800,read_timeout=120"}
    conf = [a for a in plan_for(env, "--rdzv-timeout", "600", hostname=hostname).argv if a.startswith("--rdzv-conf=")]
    assert conf == ["--rdzv-conf=is_host=false,read_timeout=120,join_timeout=600"]


def test_a_slurm_jobs_rdzv_conf_is_merged_too():
    conf = [a for a in plan_for({**olivia(1), "PET_RDZV_CONF": "join_timeout=900"}).argv if a.startswith("--rdzv-conf=")]
    assert conf == ["--rdzv-conf=is_host=false,read_timeout=450,join_timeout=900"]


def test_each_elastic_pod_logs_under_its_own_name():
    env, hostname = kubeflow_elastic(3)
    assert "--log-dir=/runs/logs/elastic-job-worker-3" in plan_for(env, "--log-dir", "/runs/logs", hostname=hostname).argv


# PET_NPROC_PER_NODE is the training operator's nprocPerNode: "Number of workers per node; supported
# values: [auto, cpu, gpu, int]" (kubeflow/training-operator, pkg/apis/kubeflow.org/v1/pytorch_types.go),
# passed to torchrun, whose determine_local_world_size (torch/distributed/run.py) counts each.
def nproc_plan(value: str, **facts_fields):
    return plan_for({**trainer_v2(0), "PET_NPROC_PER_NODE": value}, **facts_fields)


def test_nproc_cpu_starts_one_worker_per_cpu_on_cpu_as_torchrun_does():
    plan = nproc_plan("cpu", gpu_device_files=4)
    assert "--nproc-per-node=72" in plan.argv  # facts_for's 72 CPUs (sched_getaffinity)
    assert ("CUDA_VISIBLE_DEVICES", "") in {(c.name, c.value) for c in plan.changes}
    assert "72 worker(s) per node from PET_NPROC_PER_NODE=cpu (one per CPU" in "\n".join(plan.notes)


def test_nproc_auto_takes_the_gpus_else_one_worker_per_cpu():
    assert "--nproc-per-node=4" in nproc_plan("auto", gpu_device_files=4).argv
    assert "--nproc-per-node=72" in nproc_plan("auto").argv


def test_nproc_gpu_takes_the_gpus_and_without_one_stops_in_one_line_instead_of_training_on_cpu():
    assert "--nproc-per-node=2" in nproc_plan("gpu", gpu_device_files=2).argv
    with pytest.raises(LaunchError) as refused:
        nproc_plan("gpu")
    assert str(refused.value).startswith("PET_NPROC_PER_NODE=gpu but no GPU is visible here ")
    assert "Cuda is not available" in str(refused.value) and "\n" not in str(refused.value)


def test_nproc_gpu_asks_the_driver_and_a_driver_that_cannot_serve_is_one_line():
    env = {**trainer_v2(0), "PET_NPROC_PER_NODE": "gpu"}
    assert questions_for(env).cuda and not questions_for({**env, "DDP_LAUNCH_CPU_WORKERS": "2"}).cuda
    with pytest.raises(LaunchError, match=r"^PET_NPROC_PER_NODE=gpu but CUDA cannot use a GPU here \(cuInit failed"):
        nproc_plan("gpu", gpu_device_files=4, cuda_problem="cuInit failed with CUDA_ERROR_NO_DEVICE")


def test_nproc_count_and_the_users_cpu_workers_win_over_the_words():
    assert "--nproc-per-node=3" in nproc_plan("3").argv
    plan = plan_for({**trainer_v2(0), "PET_NPROC_PER_NODE": "gpu", "DDP_LAUNCH_CPU_WORKERS": "2"})
    assert "--nproc-per-node=2" in plan.argv


@pytest.mark.parametrize("value", ["0", "xpu", "four", "-1"])
def test_an_nproc_torchrun_would_refuse_is_one_line_naming_the_values(value):
    with pytest.raises(LaunchError, match=rf"^PET_NPROC_PER_NODE='{value}' is not auto, cpu, gpu or a count"):
        nproc_plan(value)


def test_a_runai_pod_without_gpus_takes_the_operators_nproc():
    plan = plan_for({**kubeflow_v1(0), "RUNAI_NUM_OF_GPUS": "0", "PET_NPROC_PER_NODE": "cpu"})
    assert "--nproc-per-node=72" in plan.argv


def test_the_words_count_as_the_installed_torchrun_counts_them_here():
    """This machine has no GPU: torchrun's own determine_local_world_size against the plan for a real probe."""
    run = pytest.importorskip("torch.distributed.run", reason="torch is in the test venv (make venv)")
    from ddp_launch import facts as node
    probed = node.cpu_count()
    assert run.determine_local_world_size("cpu") == probed == run.determine_local_world_size("auto")
    with pytest.raises(ValueError):
        run.determine_local_world_size("gpu")
    assert f"--nproc-per-node={probed}" in nproc_plan("cpu", cpu_count=probed).argv
    with pytest.raises(LaunchError):
        nproc_plan("gpu")
