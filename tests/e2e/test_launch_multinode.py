"""ddp-launch on a real 2-node SLURM cluster: c10d rendezvous across namespaces, gloo on CPU."""
import json
import re

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


def test_a_head_whose_own_name_is_127_0_1_1_rendezvous_on_its_routable_address(cluster, tmp_path):
    # Debian and Ubuntu put "127.0.1.1 <hostname>" in /etc/hosts (Debian Reference, "The
    # hostname resolution": https://www.debian.org/doc/manuals/debian-reference/ch05.en.html),
    # so on the head node getaddrinfo answers 127.0.1.1 first. Gloo and NCCL on `lo` there
    # would advertise an address the other node cannot reach.
    result = tmp_path / "allreduce.json"
    launch = ["srun", "-N2", "--ntasks-per-node=1", "tests/e2e/workloads/debian_hosts.sh",
              "ddp-launch", "--cpu-workers", "2", "--rdzv-timeout", "60", "--script", WORKLOAD]

    plans = cluster.run([*launch, "--dry-run"], timeout=180)

    assert plans.returncode == 0, plans.stderr
    assert "_SOCKET_IFNAME=lo" not in plans.stdout
    assert plans.stdout.count("GLOO_SOCKET_IFNAME=eth0") == 2, plans.stdout  # both nodes, the cluster's link

    done = cluster.run([*launch, "--", result], timeout=180)

    assert done.returncode == 0, done.stderr
    assert _result(result)["sum"] == 0 + 1 + 2 + 3
    head = [line for line in done.stderr.splitlines() if line.startswith("ddp-launch: job ")]
    assert len(head) == 1, done.stderr  # one line per job, from the head node
    # srun -N2 takes whichever two nodes are free on the shared cluster: the head is the step's first.
    node = re.search(r"head node (\S+) \(first of SLURM_STEP_NODELIST\)", head[0]).group(1)
    assert f"head node {node} (first of SLURM_STEP_NODELIST) = {cluster.address(node)}, port " in head[0]
