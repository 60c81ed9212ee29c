"""The fabric gate and the quarantine on the real cluster: the slurm/ job scripts, sbatch, srun, the
image, gloo over the nodes' veth links. A node the preflight or the gate names, replaced by a spare
node or requeued without: tests/e2e/test_spares.py.
"""
import json
from pathlib import Path

import pytest
from conftest import LONG, TWO_A_NODE, WITH_CHECKS, sbatch_args

pytestmark = pytest.mark.e2e


@pytest.fixture
def job_env(job_env: dict) -> dict:
    """conftest's job_env with the preflight and the fabric gate on: what these tests are about, and two
    ranks a node, which the gate's node round measures."""
    return {**job_env, **WITH_CHECKS, **TWO_A_NODE}


def _gate(run_dir: Path) -> dict:
    return json.loads((run_dir / "gate.json").read_text())


@pytest.fixture
def rate_limited(cluster):
    """Limit one node's egress with a token bucket (tc-tbf(8)) on its eth0, inside its namespace;
    removed after the test. netem (delay) is not built into this kernel, tbf is."""
    limited = []

    # 100 Mbit/s (0.012 GB/s of busbw between 2 nodes of 2 ranks each): a healthy pair here measures
    # 0.24 GB/s quiet and has measured 0.1 under the whole suite's load, so the slow pair stays
    # below 0.25 x the median pair (the gate's floor) with room to spare.
    def limit(node: str, rate: str = "100mbit") -> None:
        done = cluster.in_netns(node, ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", rate,
                                       "burst", "256kb", "latency", "50ms"])
        assert done.returncode == 0, done.stderr
        limited.append(node)

    yield limit
    for node in limited:
        cluster.in_netns(node, ["tc", "qdisc", "del", "dev", "eth0", "root"])


# A healthy gate passing with its figures in the job's output and gate.json: one of the three jobs of
# test_cluster_faults.py's test_three_two_node_jobs_at_once_..., a job that would train anyway.


@LONG
def test_a_corrupting_rank_is_named_with_its_wrong_element_count(cluster, job_env, tmp_path):
    job_env = {**job_env, "DDP_GATE_TEST_CORRUPT": "node2:1:7", "DDP_MAX_REQUEUES": "0"}
    job_id = cluster.sbatch([*sbatch_args(tmp_path, "--nodelist=node1,node2"), "slurm/olivia-multinode.sh"],
                            env=job_env)

    job = cluster.wait(job_id, timeout=600)

    output = job.output()
    assert job.state == "FAILED" and job.exit_code == "76:0", output
    # 7 elements perturbed at each of the 3 sizes, seen within node2's own all-reduce
    assert "fabric gate: FAIL in " in output
    assert "node node2: 21 wrong element(s) in 3 all-reduce(s) within the node" in output
    report = _gate(Path(job_env["DDP_RUN_DIR"]))
    assert report["bad_nodes"] == ["node2"]
    assert [f["kind"] for f in report["faults"]] == ["corrupt"]
    assert report["world"]["sizes"][0]["wrong"] == 7
    assert "excluded node2 (named by the gate" in output
    assert "already requeued 0 times (DDP_MAX_REQUEUES=0): not requeuing" in output
    assert "Training completed" not in output


@LONG
def test_a_slow_node_is_named_by_the_pair_rounds(cluster, job_env, tmp_path, rate_limited):
    cluster.needs_nodes(3)
    rate_limited("node3")
    # The gate runs in the trainer's ranks, after its flags are checked against the world: a global batch
    # that 3 nodes x 2 CPU workers divide (the last --batch-size wins).
    job_env = {**job_env, "DDP_MAX_REQUEUES": "0", "DDP_TRAIN_ARGS": f"{job_env['DDP_TRAIN_ARGS']} --batch-size 96"}
    job_id = cluster.sbatch([*sbatch_args(tmp_path, "--nodes=3", "--nodelist=node1,node2,node3"),
                             "slurm/olivia-multinode.sh"], env=job_env)

    job = cluster.wait(job_id, timeout=600)

    output = job.output()
    assert job.exit_code == "76:0", output
    report = _gate(Path(job_env["DDP_RUN_DIR"]))
    assert report["bad_nodes"] == ["node3"], report["verdict"]
    assert [f["kind"] for f in report["faults"]] == ["slow"]
    assert "fabric gate: FAIL in " in output and "node node3: busbw " in output
    rounds = {g["round"] for g in report["rounds"]}
    assert rounds == {"node", "pairs-1", "pairs-2"}  # ceil(log2 3) pair rounds
    # node3 is slow in every measurement: its pairs were measured again before it was named.
    assert [n for n in report["notes"] if "node3 measured again" in n], report["notes"]


def test_a_check_failing_on_every_node_stops_the_job_in_one_line_and_excludes_nothing(cluster, job_env, tmp_path):
    # The job names an interface no node has (a site's NCCL_SOCKET_IFNAME=hsn0 on another cluster): the
    # doctor's interface check FAILs on both nodes, a setup problem that excluding nodes cannot fix.
    job_env = {**job_env, "NCCL_SOCKET_IFNAME": "hsn0"}
    job_id = cluster.sbatch([*sbatch_args(tmp_path), "slurm/olivia-multinode.sh"], env=job_env)

    job = cluster.wait(job_id, timeout=600)

    output = job.output()
    assert (job.state, job.exit_code) == ("FAILED", "2:0"), output
    assert job.fields.get("Restarts") == "0" and job.fields.get("ExcNodeList") == "(null)", job.fields
    assert "ddp: error: preflight: ddp-launch doctor fails 'interface' on every node of the job (2 of 2): " in output
    assert "a setup problem, not a bad node, so nothing is excluded or requeued; fix: " in output
    run_dir = Path(job_env["DDP_RUN_DIR"])
    assert not (run_dir / "quarantine.json").exists() and not (run_dir / "gate.json").exists()
