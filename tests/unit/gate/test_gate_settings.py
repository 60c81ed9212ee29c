"""What the gate reads from its world: the test-only corruption switch and the site's expectation."""
import json

import pytest
from ddp_launch.errors import LaunchError
from ddp_launch.sites import load_site, parse_profile
from ddp_train.errors import TrainError
from ddp_train.gate.judge import expectation_from_profile
from ddp_train.gate.run import corruption, node_names


@pytest.mark.parametrize(("raw", "host", "local_rank", "count"), [
    (None, "node2", 1, 0), ("node2:1:7", "node2", 1, 7), ("node2:1:7", "node2", 0, 0),
    ("node2:1:7", "node1", 1, 0), ("node2.cluster:0:3", "node2.cluster", 0, 3),
])
def test_the_corruption_switch_hits_one_rank_of_one_node(raw, host, local_rank, count):
    env = {} if raw is None else {"DDP_GATE_TEST_CORRUPT": raw}
    assert corruption(env, host, local_rank) == count


def test_a_malformed_corruption_switch_is_one_line():
    with pytest.raises(TrainError, match="DDP_GATE_TEST_CORRUPT='node2' is not HOST:LOCAL_RANK:COUNT"):
        corruption({"DDP_GATE_TEST_CORRUPT": "node2"}, "node2", 0)


def test_nodes_are_listed_in_rank_order():
    assert node_names(["b", "b", "a", "a", "c"]) == ["b", "a", "c"]


def test_olivia_carries_cscs_published_figure_with_its_source():
    expectation = expectation_from_profile(load_site("olivia", {}).fabric_gate)
    assert expectation.size_bytes == 128 * 2**20 and expectation.busbw_gbps == 122.6
    assert expectation.sockets_busbw_gbps == 5.4 and "eth-cscs/cscs-docs" in expectation.source
    assert expectation.floor_gbps > 10 * expectation.sockets_busbw_gbps  # a socket fallback can never pass
    assert load_site("generic", {}).fabric_gate is None  # no figure: judged against the other nodes


@pytest.mark.parametrize(("gate", "problem"), [
    ({"size_bytes": 1, "busbw_gbps": 1, "floor_fraction": 0.5}, "fabric_gate.source must say"),
    ({"size_bytes": 1, "busbw_gbps": -1, "floor_fraction": 0.5, "source": "x"}, "busbw_gbps must be a positive"),
    ({"size_bytes": 1, "busbw_gbps": 1, "floor_fraction": 2, "source": "x"}, "floor_fraction must be in"),
    ({"size_bytes": True, "busbw_gbps": 1, "floor_fraction": 0.5, "source": "x"}, "size_bytes must be a positive"),
    ({"size_bytes": 1, "busbw_gbps": 1, "floor_fraction": 0.5, "source": "x", "typo": 1}, "unknown key"),
    ("fast", "must be an object"),
    ({"size_bytes": 1, "busbw_gbps": 1, "floor_fraction": 0.5, "source": "x", "device": "cuda"},
     "fabric_gate.backend must say what the figure was measured with, one of nccl, gloo; got None"),
    ({"size_bytes": 1, "busbw_gbps": 1, "floor_fraction": 0.5, "source": "x", "backend": "nccl", "device": "gpu"},
     "fabric_gate.device must say what the figure was measured with, one of cuda, cpu; got 'gpu'"),
])
def test_a_bad_fabric_gate_in_a_site_profile_names_the_key(gate, problem):
    data = {"schema": 1, "name": "x", "fabric": "auto", "gpu": None, "binds": [], "env": {}, "fabric_gate": gate}
    with pytest.raises(LaunchError, match=problem):
        parse_profile(json.loads(json.dumps(data)), "/sites/x.json")


@pytest.mark.parametrize(("rule", "problem"), [
    ({"allowed": "no", "source": "x"}, "'gate_subgroups'.allowed must be true or false"),
    ({"allowed": False, "source": ""}, "'gate_subgroups'.source must say why"),
    ({"allowed": False}, "'gate_subgroups' must be {\"allowed\": true or false"),
])
def test_a_bad_gate_subgroups_rule_names_the_key(rule, problem):
    data = {"schema": 1, "name": "x", "fabric": "auto", "binds": [], "env": {}, "gate_subgroups": rule}
    with pytest.raises(LaunchError, match=problem.replace("{", "\\{").replace("(", "\\(")):
        parse_profile(json.loads(json.dumps(data)), "/sites/x.json")
