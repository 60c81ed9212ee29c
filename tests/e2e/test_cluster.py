"""The harness itself: a 2-node SLURM cluster whose nodes are separate hosts."""
import pytest

pytestmark = pytest.mark.e2e


def test_srun_runs_one_task_on_each_node(cluster):
    done = cluster.run(["srun", f"-N{cluster.nodes}", "hostname"], timeout=60)

    assert done.returncode == 0
    assert sorted(done.stdout.split()) == cluster.node_names


def test_node_names_resolve_to_their_own_addresses_inside_the_cluster(cluster):
    done = cluster.run(["srun", "-N1", "-w", "node2", "getent", "hosts", "node1", "node2"], timeout=60)

    assert done.returncode == 0
    assert done.stdout.split() == [cluster.address("node1"), "node1", cluster.address("node2"), "node2"]
