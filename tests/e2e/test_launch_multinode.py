"""ddp-launch on a real 2-node SLURM cluster: c10d rendezvous across namespaces, gloo on CPU."""
import json

import pytest

pytestmark = pytest.mark.e2e

WORKLOAD = "tests/e2e/workloads/allreduce.py"


def _result(path):
    return json.loads(path.read_text())


def test_one_task_per_node_runs_torchrun_with_two_workers_on_each_node(cluster, tmp_path):
    result = tmp_path / "allreduce.json"

    done = cluster.run(["srun", "-N2", "--ntasks-per-node=1", "ddp-launch", "--cpu-workers", "2",
                        "--script", WORKLOAD, "--", result], timeout=180)

    assert done.returncode == 0, done.stderr
    got = _result(result)
    assert got["world_size"] == 4
    assert got["sum"] == 0 + 1 + 2 + 3
    assert got["hosts"] == ["node1", "node1", "node2", "node2"]
    assert got["under_torchrun"] is True


def test_one_task_per_gpu_mode_runs_each_srun_task_as_a_rank(cluster, tmp_path):
    result = tmp_path / "allreduce.json"

    done = cluster.run(["srun", "-N2", "--ntasks-per-node=2", "ddp-launch",
                        "--script", WORKLOAD, "--", result], timeout=180)

    assert done.returncode == 0, done.stderr
    got = _result(result)
    assert got["world_size"] == 4
    assert got["sum"] == 6
    assert got["local_world_size"] == 2
    assert sorted(got["hosts"]) == ["node1", "node1", "node2", "node2"]
    assert got["under_torchrun"] is False
