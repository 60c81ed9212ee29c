"""A site whose stack can hang in a second process group (LUMI's: lumi-ai-factory/laifs-container-recipes#44)
gets a gate that builds none: it measures the world on its default group, and a failure it cannot narrow
names no node, so neither a hang in a subgroup nor the node it happened on can cost the job a healthy node."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from ddp_launch.sites import load_site
from ddp_train.gate import judge
from ddp_train.gate.run import site_refuses_subgroups

# One rank of the real gate (ddp_train.gate.run.gate) with gloo on CPU, as `python -m ddp_train.gate` runs
# it, on a node named by FAKE_HOST; it counts the process groups it creates besides the world's.
GATE_RANK = textwrap.dedent("""
    import os, socket, sys
    import torch.distributed as dist
    created = []
    real_new_group = dist.new_group
    def new_group(*args, **kwargs):
        created.append(args)
        return real_new_group(*args, **kwargs)
    dist.new_group = new_group
    socket.gethostname = lambda: os.environ["FAKE_HOST"]
    from ddp_train.gate import run
    code = run.gate(run.parse_args(sys.argv[1:]), os.environ)
    print(f"exit {code}, {len(created)} group(s) created", flush=True)
    os._exit(0)
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                            "MASTER_ADDR", "MASTER_PORT")}
    # Two nodes of one rank each: node n1 is rank 0, node n2 rank 1.
    return {**env, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "FAKE_HOST": f"n{rank + 1}",
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", **extra}


def run_gate(run_dir, site: str, **extra: str) -> list[str]:
    port = free_port()
    argv = ["--run-dir", str(run_dir), "--site", site, "--device", "cpu", "--sizes", "4096", "--iters", "1",
            "--timeout", "60"]
    ranks = [subprocess.Popen([sys.executable, "-c", GATE_RANK, *argv], stdout=subprocess.PIPE, text=True,
                              env=rank_env(rank, port, **extra)) for rank in (0, 1)]
    return [rank.communicate(timeout=180)[0].strip().splitlines()[-1] for rank in ranks]  # rank 0 prints the report first


def test_lumi_forbids_the_gates_subgroups_with_its_source():
    refused = site_refuses_subgroups(load_site("lumi", {}))
    assert refused is not None and refused.startswith("no node or pair rounds: site lumi builds no process group")
    assert "laifs-container-recipes#44" in refused
    assert site_refuses_subgroups(load_site("olivia", {})) is None
    assert site_refuses_subgroups(None) is None


def test_on_lumi_a_corrupting_node_fails_the_gate_without_a_subgroup_and_without_naming_a_node(tmp_path):
    # Elsewhere node n2 would be named from its own group (tests/e2e/test_fabric_gate.py): one rank of n2
    # corrupts 7 elements of each all-reduce.
    said = run_gate(tmp_path, "lumi", DDP_GATE_TEST_CORRUPT="n2:0:7")
    assert said == ["exit 1, 0 group(s) created"] * 2  # 1: a failure naming no node (76 would exclude n2)
    report = json.loads((tmp_path / "gate.json").read_text())
    assert not report["ok"] and report["bad_nodes"] == [] and report["faults"] == [] and report["rounds"] == []
    assert report["world"]["sizes"][0]["wrong"] == 7
    assert report["verdict"].startswith("fabric gate: FAIL in ")
    assert ("7 wrong element(s) in the all-reduce over all nodes, not narrowed to a node: no node or pair rounds: "
            "site lumi builds no process group but the world's") in report["verdict"]


@pytest.mark.parametrize(("nodes", "pairs", "note"), [
    (3, True, "no published bus bandwidth for this site: the nodes are judged against each other"),
    (3, False, f"no published bus bandwidth for this site and no pair rounds to compare the nodes: {judge.NOT_JUDGED}"),
    (2, False, f"no published bus bandwidth for this site and fewer than 3 nodes to compare: {judge.NOT_JUDGED}"),
])
def test_without_pair_rounds_nodes_are_not_said_to_be_compared(nodes, pairs, note):
    assert judge.judged_expectation(None, nodes, "gloo", "cpu", pairs=pairs) == (None, (note,))
