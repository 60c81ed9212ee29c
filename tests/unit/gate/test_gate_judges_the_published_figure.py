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
