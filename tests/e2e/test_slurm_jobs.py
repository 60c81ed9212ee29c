"""The slurm/ job scripts submitted with sbatch to the real 2-node cluster."""
import json
from pathlib import Path

import pytest
from conftest import container_versions, sbatch_args

pytestmark = pytest.mark.e2e


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_multinode_script_trains_across_two_nodes_to_completion(cluster, job_env, tmp_path):
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)

    job = cluster.wait(job_id, timeout=240)

    output = job.output()
    assert job.state == "COMPLETED", output
    assert "Number of nodes: 2" in output
    assert "World size: 4" in output
    assert "Training completed successfully." in output
    run_dir = Path(job_env["DDP_RUN_DIR"])
    summary = [r for r in _records(run_dir) if r["type"] == "summary"]
    assert summary and summary[-1]["world_size"] == 4 and summary[-1]["nodes"] == 2
    assert (run_dir / "checkpoint.pt").is_file()
    logs = run_dir / "logs" / job_id
    nodes = cluster.job_nodes(job)
    for node in nodes:
        streams = sorted(logs.glob(f"{node}/*/attempt_0/*/stdout.log"))
        assert len(streams) == 2, f"{node}: {streams}"  # one per worker on the node
    assert "Training completed successfully." in "".join(
        p.read_text() for p in logs.glob("*/*/attempt_0/*/stdout.log"))
    assert f"{nodes[0]}:rank0: " in output
    run = [r for r in _records(run_dir) if r["type"] == "run"][-1]
    assert {k: run["versions"][k] for k in ("python", "torch")} == container_versions(Path(job_env["DDP_IMAGE"]))


def test_multinode_script_runs_a_gpu_sampler_on_every_node(cluster, job_env, tmp_path):
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)

    job = cluster.wait(job_id, timeout=240)

    assert job.state == "COMPLETED", job.output()
    gpu_dir = Path(job_env["DDP_RUN_DIR"]) / "gpu"
    for node in cluster.job_nodes(job):
        log = (gpu_dir / f"sampler-{node}.log").read_text()
        assert f"nvidia-smi not found on {node}" in log
    assert "GPU sampler stopped" in job.output()


def test_task_per_gpu_script_runs_two_ranks_on_each_of_two_nodes(cluster, job_env, tmp_path):
    job_id = cluster.sbatch([*sbatch_args(tmp_path, "--nodes=2", "--ntasks-per-node=2", "--gres=none"),
                             "slurm/raven-task-per-gpu.sh"], env=job_env)

    job = cluster.wait(job_id, timeout=240)

    output = job.output()
    assert job.state == "COMPLETED", output
    assert "World size: 4" in output
    logs = sorted(p.name for p in (Path(job_env["DDP_RUN_DIR"]) / "logs").glob("*.out"))
    first, second = cluster.job_nodes(job)
    assert logs == [f"{job_id}-{first}-rank0.out", f"{job_id}-{first}-rank1.out",
                    f"{job_id}-{second}-rank2.out", f"{job_id}-{second}-rank3.out"]
    run = [r for r in _records(Path(job_env["DDP_RUN_DIR"])) if r["type"] == "run"][-1]
    assert {k: run["versions"][k] for k in ("python", "torch")} == container_versions(Path(job_env["DDP_IMAGE"]))
    # One sampler per node although the job has 2 tasks per node and the step inherits SLURM_NTASKS=4
    # (srun(1): --ntasks wins over --ntasks-per-node; the step names both, so any srun agrees).
    for node in (first, second):
        said = (Path(job_env["DDP_RUN_DIR"]) / "gpu" / f"sampler-{node}.log").read_text()
        assert said.count(f"nvidia-smi not found on {node}") == 1, said


@pytest.mark.parametrize("script,tasks", [("slurm/raven-1gpu.sh", 1), ("slurm/raven-1node-4gpu.sh", 2)])
def test_raven_one_node_scripts_run_one_rank_per_task_and_stream_rank_0(cluster, job_env, tmp_path, script, tasks):
    # The single-GPU and one-node rows of the scaling table, as 1 and 2 CPU tasks on one node;
    # one short epoch (trainer flags after the script win), since the layout is what is tested.
    job_id = cluster.sbatch([*sbatch_args(tmp_path, "--nodes=1", f"--ntasks-per-node={tasks}", "--gres=none"),
                             script, "--epochs", "1", "--limit-train", "256"], env=job_env)

    job = cluster.wait(job_id, timeout=240)

    output = job.output()
    assert job.state == "COMPLETED", output
    assert f"World size: {tasks}" in output and "Number of nodes: 1" in output
    logs = sorted(p.name for p in (Path(job_env["DDP_RUN_DIR"]) / "logs").glob("*.out"))
    assert logs == [f"{job_id}-node1-rank{rank}.out" for rank in range(tasks)]
    # Rank 0's whole log reached the job's output (streamed), not only its last lines.
    rank0 = (Path(job_env["DDP_RUN_DIR"]) / "logs" / logs[0]).read_text()
    assert rank0.splitlines()[0] in output and "Training completed successfully." in output


# The scripts no other test submits: each end to end through the real `apptainer run`, with its
# own sbatch lines but for the partition, the GPUs and (for the 6-node Ethernet ones) the node
# count; one short epoch at a batch the test data holds (trainer flags after the script win).
# ethernet-gloo.sh runs the CPU image (containers/cpu.def), the others the x86_64 GPU image.
OTHER_SCRIPTS = {
    "slurm/olivia-1gpu.sh": ("x86", 1),
    "slurm/olivia-1node-4gpu.sh": ("x86", 1),
    "slurm/ethernet-gloo.sh": ("cpu", 2),
    "slurm/ethernet-nccl.sh": ("x86", 2),
}


@pytest.mark.parametrize("script", sorted(OTHER_SCRIPTS))
def test_every_other_job_script_trains_to_completion_through_apptainer(cluster, job_env, images, tmp_path, script):
    which, nodes = OTHER_SCRIPTS[script]
    image_path = images.cpu if which == "cpu" else images.x86
    job_env = {k: v for k, v in job_env.items() if k != "DDP_TRAIN_ARGS"}  # the script's own, then ours
    job_env["DDP_IMAGE"] = str(image_path)
    job_id = cluster.sbatch([*sbatch_args(tmp_path, f"--nodes={nodes}"), script, "--epochs", "1",
                             "--batch-size", "64", "--width-scale", "0.25", "--allow-unverified-data"], env=job_env)

    job = cluster.wait(job_id, timeout=300)

    output = job.output()
    assert job.state == "COMPLETED", output
    assert f"Number of nodes: {nodes}" in output and "Training completed successfully." in output
    run = [r for r in _records(Path(job_env["DDP_RUN_DIR"])) if r["type"] == "run"][-1]
    assert {k: run["versions"][k] for k in ("python", "torch")} == container_versions(image_path)


def test_job_script_refuses_to_start_without_staged_data(cluster, job_env, tmp_path):
    job_env = {**job_env, "DDP_DATA_DIR": str(tmp_path / "nowhere")}
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)

    job = cluster.wait(job_id, timeout=60)

    assert job.state == "FAILED"
    assert f"{tmp_path / 'nowhere'}/cifar-100-python lacks train, test, meta: run 'make data" in job.output()
