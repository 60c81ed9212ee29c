"""Where a site's published all-reduce figure judges the gate: across nodes, with the backend and
devices it was measured with (nccl-tests' NCCL on GPUs); elsewhere a note says why it does not."""
import json

import pytest
from ddp_launch.sites import load_site
from ddp_train.gate.judge import NOT_JUDGED, Expectation, expectation_from_profile, judged_expectation
from ddp_train.gate.run import gate, parse_args

OLIVIA = expectation_from_profile(load_site("olivia", {}).fabric_gate)


def test_one_rank_with_olivias_figure_passes_with_a_note_instead_of_failing_below_the_floor(tmp_path, capsys):
    # `python -m ddp_train.gate --site olivia` on one rank: busbw is 0 by nccl-tests' definition
    # (2(n-1)/n = 0), far below the 61.3 GB/s floor, and says nothing about the fabric.
    args = parse_args(["--run-dir", str(tmp_path), "--site", "olivia", "--device", "cpu",
                       "--sizes", "4096", "--iters", "1"])
    assert gate(args, {}) == 0
    report = json.loads((tmp_path / "gate.json").read_text())
    assert report["ok"] and report["expectation"] is None
    assert report["notes"] == ["the site's published 122.6 GB/s is between nodes and this gate ran within one node "
                               f"and fewer than 3 nodes to compare: {NOT_JUDGED}"]
    out = capsys.readouterr().out
    assert "fabric gate: PASS" in out and "below the floor" not in out


def test_olivias_figure_says_what_it_was_measured_with():
    assert (OLIVIA.backend, OLIVIA.device) == ("nccl", "cuda")  # CSCS ran nccl-tests' all_reduce_perf on GH200


@pytest.mark.parametrize(("nodes", "backend", "device", "judged", "note"), [
    (2, "nccl", "cuda", True, None),
    (8, "nccl", "cuda", True, None),
    (1, "nccl", "cuda", False, "the site's published 122.6 GB/s is between nodes and this gate ran within one node "
                               f"and fewer than 3 nodes to compare: {NOT_JUDGED}"),
    (2, "gloo", "cpu", False, "the site's published 122.6 GB/s was measured with nccl on cuda and this gate ran "
                              f"gloo on cpu and fewer than 3 nodes to compare: {NOT_JUDGED}"),
    (2, "gloo", "cuda", False, "the site's published 122.6 GB/s was measured with nccl on cuda and this gate ran "
                               f"gloo on cuda and fewer than 3 nodes to compare: {NOT_JUDGED}"),
    (4, "gloo", "cpu", False, "the site's published 122.6 GB/s was measured with nccl on cuda and this gate ran "
                              "gloo on cpu: the nodes are judged against each other"),
])
def test_the_published_figure_judges_only_across_nodes_with_its_own_backend_and_device(nodes, backend, device,
                                                                                       judged, note):
    expectation, notes = judged_expectation(OLIVIA, nodes, backend, device)
    assert (expectation is OLIVIA) is judged
    assert notes == ((note,) if note else ())


def test_without_a_figure_two_nodes_are_reported_and_three_are_compared():
    assert judged_expectation(None, 2, "nccl", "cuda") == (
        None, (f"no published bus bandwidth for this site and fewer than 3 nodes to compare: {NOT_JUDGED}",))
    assert judged_expectation(None, 3, "gloo", "cpu") == (
        None, ("no published bus bandwidth for this site: the nodes are judged against each other",))


def test_a_figure_measured_with_gloo_judges_gloo():
    gloo = Expectation(4 * 2**20, 1.0, 0.5, "a gloo figure", backend="gloo", device="cpu")
    assert judged_expectation(gloo, 2, "gloo", "cpu") == (gloo, ())


# -- two pods, or two nodes, on an RDMA fabric no site has a figure for: the links' own rate ------------

from ddp_train.gate.judge import GroupResult, SizeResult, decide, link_expectation, port_rate_gbits  # noqa: E402
from ddp_train.gate.run import nccl_hca_selects, node_link_gbits  # noqa: E402

MiB = 2**20


@pytest.mark.parametrize(("text", "gbits"), [
    ("100 Gb/sec (4X EDR)\n", 100.0), ("200 Gb/sec (4X HDR)", 200.0), ("25 Gb/sec (1X EDR)", 25.0),
    ("2.5 Gb/sec (1X SDR)", 2.5), ("0 GB/sec", None), ("", None), ("unknown", None)])
def test_a_ports_rate_is_read_as_the_kernel_writes_it(text, gbits):
    # Documentation/ABI/stable/sysfs-class-infiniband: rate, e.g. "100 Gb/sec (4X EDR)".
    assert port_rate_gbits(text) == gbits


def pair_of_pods(busbw_gbps: float) -> tuple[GroupResult, list, list]:
    """Two pods of one GPU each, their world (which is their one pair) at busbw_gbps at 128 MiB."""
    size = SizeResult(128 * MiB, 128 * MiB / (busbw_gbps * 1e9) * 1e6, busbw_gbps, busbw_gbps, 0)
    world = GroupResult("world", ("rcp-master-0", "rcp-worker-0"), 2, (size,))
    nodes = [GroupResult("node", (name,), 1, (SizeResult(128 * MiB, 1.0, 0.0, 0.0, 0),)) for name in world.nodes]
    return world, nodes, [GroupResult("pairs-1", world.nodes, 2, (size,))]


def test_two_roce_pods_at_a_fraction_of_their_links_rate_fail_the_gate():
    # 100 Gb/s RoCE in both pods is 12.5 GB/s; a link at a tenth of it (1.25 GB/s busbw) fails, where
    # before nothing judged two pods ("fewer than 3 nodes to compare").
    link = link_expectation({"rcp-master-0": 100.0, "rcp-worker-0": 100.0}, 128 * MiB)
    expectation, notes = judged_expectation(link, 2, "nccl", "cuda")
    assert expectation is link and notes == () and link.floor_gbps == pytest.approx(3.125)
    world, nodes, pairs = pair_of_pods(1.25)
    report = decide(world, nodes, pairs, expectation, (), 1.0, "nccl on cuda")
    assert not report.ok and report.bad_nodes == ("rcp-master-0", "rcp-worker-0")
    assert "busbw 1.250 GB/s at 128 MiB between rcp-master-0+rcp-worker-0" in report.verdict
    assert "the RDMA links' rate, sysfs ports/<p>/rate (rcp-master-0 100 Gb/s, rcp-worker-0 100 Gb/s)" in report.verdict
    healthy, nodes, pairs = pair_of_pods(10.5)
    assert decide(healthy, nodes, pairs, expectation, (), 1.0, "nccl on cuda").ok


def test_the_slowest_nodes_rate_sets_the_figure_and_a_node_without_one_leaves_none():
    assert link_expectation({"a": 400.0, "b": 200.0}, 128 * MiB).busbw_gbps == 25.0
    assert link_expectation({"a": 400.0, "b": None}, 128 * MiB) is None
    # gloo on CPU workers does not run on the links: their figure does not judge it.
    link = link_expectation({"a": 100.0, "b": 100.0}, 4 * MiB)
    assert judged_expectation(link, 2, "gloo", "cpu")[0] is None


def test_a_nodes_rate_counts_the_active_ports_nccl_may_use(tmp_path):
    def port(device, number, rate, state="4: ACTIVE"):
        base = tmp_path / "sys/class/infiniband" / device / "ports" / number
        base.mkdir(parents=True)
        (base / "rate").write_text(rate + "\n")
        (base / "state").write_text(state + "\n")
    port("mlx5_0", "1", "200 Gb/sec (4X HDR)")
    port("mlx5_1", "1", "200 Gb/sec (4X HDR)")
    port("mlx5_2", "1", "100 Gb/sec (4X EDR)", state="1: DOWN")
    port("mlx5_bond_0", "1", "100 Gb/sec (4X EDR)")
    root = str(tmp_path)
    assert node_link_gbits({}, root) == 500.0
    assert node_link_gbits({"NCCL_IB_HCA": "mlx5_bond_0"}, root) == 100.0
    assert node_link_gbits({"NCCL_IB_HCA": "=mlx5_0,mlx5_1:1"}, root) == 400.0
    assert node_link_gbits({"NCCL_IB_HCA": "^mlx5_bond"}, root) == 400.0
    assert node_link_gbits({"NCCL_IB_DISABLE": "1"}, root) is None
    assert node_link_gbits({}, str(tmp_path / "no-rdma")) is None
    assert nccl_hca_selects("mlx5", "mlx5_3", "1") and not nccl_hca_selects("=mlx5", "mlx5_3", "1")
