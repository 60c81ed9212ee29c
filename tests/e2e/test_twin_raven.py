"""slurm/raven-*.sh on Raven's twin, unchanged and with their own site (raven).

The twin (tests/e2e/cluster/twins/raven.sh, tests/e2e/twins.py): GPU nodes ravgNNNN on IP over
InfiniBand (ib0) with their HCA in /sys/class/infiniband, found by the node feature gpu in the
gpu partition, four A100 a node in gres. The image is the plain x86_64 one (Raven's scripts run
train-x86_64.sif with the raven site). The scripts get only --output and short-training flags
(raven-task-per-gpu.sh through the README's Raven quick start's sbatch line, word for word); each
SLURM task trains on CPU in place of its GPU, one rank a task.
"""
from __future__ import annotations

import re

import pytest
import twins
from conftest import OWN_SCRIPT, container_versions, doctor_reports, metrics_records, rank_logs, run_twin_scripts

pytestmark = pytest.mark.e2e

TWIN = twins.RAVEN


ONE_NODE_SCRIPTS = {"slurm/raven-1gpu.sh": 1, "slurm/raven-1node-4gpu.sh": 4}


@pytest.fixture(scope="module")
def raven_jobs(twin, images, cifar_data, tmp_path_factory):
    """Every Raven script submitted at once, as on Raven (--constraint=gpu, a task per A100): the
    task-per-GPU script takes two of the three nodes, the one-node scripts the third in turn, and after
    them the README's own-script quick start for Raven (examples/env_ranks.py in raven-1node-4gpu.sh)."""
    return run_twin_scripts(twin, TWIN, ("slurm/raven-task-per-gpu.sh", *ONE_NODE_SCRIPTS), images.x86, cifar_data,
                            tmp_path_factory, own_script=True)


@pytest.fixture(scope="module")
def task_per_gpu(raven_jobs):
    return raven_jobs["slurm/raven-task-per-gpu.sh"]


def test_raven_task_per_gpu_runs_four_ranks_on_each_of_two_nodes(twin, task_per_gpu, images):
    job, run_dir, output = task_per_gpu
    assert job.state == "COMPLETED", output
    assert "site raven" in output and "World size: 8" in output and "Training completed successfully." in output
    first, second = twin.job_nodes(job)
    assert (first, second) == ("ravg1001", "ravg1002")
    assert rank_logs(run_dir) == [f"{job.job_id}-{first if rank < 4 else second}-rank{rank}.out" for rank in range(8)]
    run = [r for r in metrics_records(run_dir) if r["type"] == "run"][-1]
    assert {k: run["versions"][k] for k in ("python", "torch")} == container_versions(images.x86)


def test_raven_sampler_runs_once_per_node_though_the_job_has_four_tasks_a_node(twin, task_per_gpu):
    # srun(1): --ntasks wins over --ntasks-per-node, and the step inherits SLURM_NTASKS=8; the
    # sampler's step names both, so one sampler runs on each node.
    job, run_dir, _ = task_per_gpu
    for node in twin.job_nodes(job):
        said = (run_dir / "gpu" / f"sampler-{node}.log").read_text()
        assert said.count(f"nvidia-smi not found on {node}") == 1, said


def test_raven_preflight_sees_the_infiniband_hca_and_the_granted_a100s(task_per_gpu):
    job, run_dir, _ = task_per_gpu
    reports = doctor_reports(run_dir, job)
    assert sorted(reports) == ["ravg1001", "ravg1002"]
    for node, checks in reports.items():
        assert checks["fabric devices"]["status"] == "OK" and checks["fabric devices"]["detail"].endswith(
            "devices: mlx5_0"), (node, checks["fabric devices"])
        assert checks["gpus"]["status"] == "WARN" and "4 granted" in checks["gpus"]["detail"], checks["gpus"]


@pytest.mark.parametrize("script", ONE_NODE_SCRIPTS)
def test_raven_one_node_scripts_run_one_rank_per_task_and_stream_rank_0(twin, raven_jobs, script):
    job, run_dir, output = raven_jobs[script]
    tasks = ONE_NODE_SCRIPTS[script]
    assert job.state == "COMPLETED", output
    assert f"World size: {tasks}" in output and "Number of nodes: 1" in output
    (node,) = twin.job_nodes(job)
    assert rank_logs(run_dir) == [f"{job.job_id}-{node}-rank{rank}.out" for rank in range(tasks)]
    # Rank 0's whole log reached the job's output (streamed), not only its last lines.
    rank0 = (run_dir / "logs" / rank_logs(run_dir)[0]).read_text()
    assert rank0.splitlines()[0] in output and "Training completed successfully." in output


def test_raven_twin_nodes_carry_ib0_the_hca_the_gpu_feature_and_four_a100(twin):
    done = twin.run(["srun", "--constraint=gpu", "--nodelist=ravg1002", "--gres=gpu:a100:4", "sh", "-c",
                     "hostname; ls /sys/class/net; ls /sys/class/infiniband; "
                     "cat /sys/class/infiniband/mlx5_0/ports/1/link_layer; echo $CUDA_VISIBLE_DEVICES"], timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ravg1002", "ib0", "lo", "mlx5_0", "InfiniBand", "0,1,2,3"]
    nodes = twin.run(["sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %P %f %G %c"], timeout=30).stdout.split("\n")
    assert "ravg1001 gpu* gpu gpu:a100:4 72" in nodes


def test_raven_own_script_reading_rank_and_local_rank_runs_one_rank_per_task(twin, raven_jobs):
    """The README's own-script line for Raven, word for word: examples/env_ranks.py reads RANK, WORLD_SIZE and
    LOCAL_RANK itself, which ddp-launch sets from SLURM's task variables, one SLURM task a rank."""
    job, run_dir, output = raven_jobs[OWN_SCRIPT]
    assert job.state == "COMPLETED", output
    assert "ranks [0, 1, 2, 3] of 4, local ranks [0, 1, 2, 3], 1 host(s)" in output and "done: 200 steps" in output
    (node,) = twin.job_nodes(job)
    assert rank_logs(run_dir) == [f"{job.job_id}-{node}-rank{rank}.out" for rank in range(4)]
    (checks,) = doctor_reports(run_dir, job).values()
    assert checks["workload"]["status"] == "OK" and checks["dataset"]["status"] == "SKIP", checks["workload"]
    assert re.search(r"fabric gate: PASS in [\d.]+ s on 1 node\(s\), 4 ranks", output), output
