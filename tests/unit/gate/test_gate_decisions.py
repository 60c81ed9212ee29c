"""The fabric gate's pure parts: the pattern and its exact sum, nccl-tests' bandwidth, the pair
schedule, and who gets blamed."""
import json
import math

import numpy as np
import pytest
from ddp_train.gate import judge
from ddp_train.gate.judge import Expectation, GroupResult, SizeResult

MiB = 2**20


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7, 8, 9, 64, 1000])
def test_the_expected_sum_is_the_elementwise_sum_of_every_rank_contribution(ranks):
    count = 4 * judge.PATTERN_PERIOD + 3
    contributions = [[judge.contribution(r, i) for i in range(count)] for r in range(ranks)]
    period = judge.expected_period(range(ranks))
    assert [period[i % judge.PATTERN_PERIOD] for i in range(count)] == [sum(c[i] for c in contributions)
                                                                     for i in range(count)]


def test_contributions_are_small_integers_that_depend_on_the_rank():
    assert {judge.contribution(r, i) for r in range(16) for i in range(16)} == set(range(1, judge.PATTERN_PERIOD + 1))
    assert [judge.contribution(0, i) for i in range(8)] != [judge.contribution(1, i) for i in range(8)]


def test_a_missing_or_doubled_rank_changes_every_element_of_the_sum():
    full = judge.expected_period(range(6))
    assert all(a != b for a, b in zip(full, judge.expected_period([0, 1, 2, 3, 5])))
    assert all(a != b for a, b in zip(full, judge.expected_period([0, 1, 2, 3, 4, 5, 5])))


def test_the_sum_is_exact_in_float32_in_any_order_up_to_the_largest_world():
    # The worst case: every partial sum an integer <= 8 n, below 2**24 (the float32 significand).
    n = judge.MAX_EXACT_RANKS
    assert float(np.float32(judge.PATTERN_PERIOD * n)) == judge.PATTERN_PERIOD * n
    rng = np.random.default_rng(0)
    values = np.array([judge.contribution(r, 5) for r in range(20000)], dtype=np.float32)
    exact = int(sum(int(v) for v in values))
    for _ in range(3):
        shuffled = rng.permutation(values)
        total = np.float32(0)
        for v in shuffled:
            total = np.float32(total + v)
        assert int(total) == exact
    with pytest.raises(ValueError, match="exact in float32 only up to"):
        judge.expected_period(range(n + 1))


def test_bandwidth_follows_nccl_tests_performance_md():
    # PERFORMANCE.md: algbw = S/t; all-reduce busbw = algbw * 2(n-1)/n.
    assert judge.algbw_gbps(128 * MiB, 1.916e-3) == pytest.approx(70.05, abs=0.01)
    # CSCS's 2 x 4 GH200 row: 128 MiB in 1916 us is busbw 122.6 GB/s on 8 ranks.
    assert judge.busbw_gbps(128 * MiB, 1.916e-3, 8) == pytest.approx(122.6, abs=0.1)
    assert judge.busbw_gbps(MiB, 1e-3, 2) == judge.algbw_gbps(MiB, 1e-3)
    assert judge.busbw_gbps(MiB, 1e-3, 1) == 0.0
    assert judge.algbw_gbps(MiB, 0.0) == 0.0


def test_one_line_per_size_has_the_nccl_tests_columns():
    line = SizeResult.measured(MiB, 2e-3, 4, 3).line()
    assert line.split() == ["1", "MiB", "2000.0", "us", "algbw", "0.524", "GB/s", "busbw", "0.786", "GB/s",
                            "#wrong", "3"]


@pytest.mark.parametrize(("nodes", "rounds"), [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (8, 3), (9, 4), (64, 6)])
def test_pair_rounds_are_logarithmic_and_disjoint(nodes, rounds):
    schedule = judge.pair_rounds(nodes)
    assert len(schedule) == rounds == (math.ceil(math.log2(nodes)) if nodes > 1 else 0)
    for pairs in schedule:
        flat = [n for pair in pairs for n in pair]
        assert len(flat) == len(set(flat)) and all(0 <= n < nodes for n in flat)
    partners = {i: {b if a == i else a for pairs in schedule for a, b in pairs if i in (a, b)} for i in range(nodes)}
    assert all(partners[i] for i in range(nodes)) or nodes == 1  # everyone is tested at least once
    if nodes & (nodes - 1) == 0:  # a power of two: every node meets log2 n distinct partners
        assert all(len(p) == rounds for p in partners.values())


def _pair(nodes, busbw, round_name="pairs-1", size=4 * MiB):
    seconds = size / (busbw * 1e9)
    return GroupResult(round_name, tuple(nodes), 2, (SizeResult.measured(size, seconds, 2, 0),))


def test_a_node_slow_with_every_partner_is_named_and_its_fast_partners_are_cleared():
    pairs = [_pair(("n0", "n1"), 1.0), _pair(("n2", "n3"), 0.05), _pair(("n0", "n2"), 0.04, "pairs-2"),
             _pair(("n1", "n3"), 0.9, "pairs-2")]
    faults = judge.blame_pairs(pairs, None)
    assert [(f.kind, f.nodes) for f in faults] == [("slow", ("n2",))]
    assert "0.25 x the median pair (0.900 GB/s)" in faults[0].expected


# A 6-node twin's pair rounds on a loaded 2-core machine, healthy nodes all: the pairs spread 6x,
# and the slowest (0.096 GB/s at first) was a quarter of the fastest (0.613).
LOADED_SIX_NODES = [_pair(("n0", "n1"), 0.096), _pair(("n2", "n3"), 0.385), _pair(("n4", "n5"), 0.205),
                    _pair(("n0", "n2"), 0.159, "pairs-2"), _pair(("n1", "n3"), 0.588, "pairs-2"),
                    _pair(("n0", "n4"), 0.613, "pairs-3"), _pair(("n1", "n5"), 0.178, "pairs-3")]


def test_the_floor_follows_the_median_pair_so_one_lucky_pair_names_nobody():
    floor, how = judge.slow_threshold(LOADED_SIX_NODES, None)
    assert floor == pytest.approx(0.25 * 0.205) and "0.25 x the median pair (0.205 GB/s)" in how
    assert judge.blame_pairs(LOADED_SIX_NODES, None) == []
    assert judge.rounds_to_repeat(LOADED_SIX_NODES, None) == []


def test_a_node_slow_with_each_of_its_partners_among_six_is_still_named():
    # n5 on a socket fallback: ten times slower with both its partners (n4 in pairs-1, n1 in pairs-3; 5 XOR 2
    # is no node, so it sits out pairs-2).
    slow_n5 = [g if "n5" not in g.nodes else _pair(g.nodes, 0.02, g.round) for g in LOADED_SIX_NODES]
    assert [f.nodes for f in judge.blame_pairs(slow_n5, None)] == [("n5",)]


def test_three_nodes_name_the_third_from_two_rounds():
    pairs = [_pair(("node1", "node2"), 0.5), _pair(("node1", "node3"), 0.02, "pairs-2")]
    assert [f.nodes for f in judge.blame_pairs(pairs, None)] == [("node3",)]


def test_a_slow_pair_between_two_cleared_nodes_is_a_link():
    pairs = [_pair(("a", "b"), 0.01), _pair(("a", "c"), 1.0, "pairs-2"), _pair(("b", "d"), 1.0, "pairs-2"),
             _pair(("c", "d"), 1.0)]
    (fault,) = judge.blame_pairs(pairs, None)
    assert fault.nodes == ("a", "b") and fault.what == "link a-b"


def test_two_nodes_alone_cannot_be_told_apart_so_both_are_suspects():
    faults = judge.blame_pairs([_pair(("a", "b"), 0.01), _pair(("c", "d"), 1.0)], None)
    assert sorted(f.nodes for f in faults) == [("a",), ("b",)]


def test_only_the_rounds_with_a_pair_below_the_floor_are_measured_again():
    fast = [_pair(("a", "b"), 1.0), _pair(("c", "d"), 0.9), _pair(("a", "c"), 0.8, "pairs-2"),
            _pair(("b", "d"), 0.95, "pairs-2")]
    assert judge.rounds_to_repeat(fast, None) == []
    one_slow = [*fast[:3], _pair(("b", "d"), 0.1, "pairs-2")]
    assert judge.rounds_to_repeat(one_slow, None) == ["pairs-2"]


def test_a_pair_slow_once_and_fast_again_names_no_node_and_the_report_keeps_both_figures():
    first = [_pair(("node2", "node3"), 0.156), _pair(("node2", "node4"), 0.024, "pairs-2")]
    assert [f.nodes for f in judge.blame_pairs(first, None)] == [("node4",)]  # one measurement alone blames it
    kept, notes = judge.faster_of(first, [_pair(("node2", "node4"), 0.150, "pairs-2")])
    assert judge.blame_pairs(kept, None) == []
    assert [g.largest.busbw_gbps for g in kept] == pytest.approx([0.156, 0.150])
    assert notes == ("node2+node4 measured again: busbw 0.024 then 0.150 GB/s at 4 MiB; the faster is judged",)


def test_a_pair_slow_both_times_is_still_named_by_its_faster_figure():
    first = [_pair(("n1", "n2"), 0.5), _pair(("n1", "n3"), 0.02, "pairs-2")]
    kept, _ = judge.faster_of(first, [_pair(("n1", "n3"), 0.03, "pairs-2")])
    (fault,) = judge.blame_pairs(kept, None)
    assert fault.nodes == ("n3",) and "busbw 0.030 GB/s" in fault.measured


def test_the_published_figure_sets_the_floor_when_there_is_one():
    expectation = Expectation(128 * MiB, 122.6, 0.5, "CSCS")
    pairs = [_pair(("a", "b"), 100.0, size=128 * MiB), _pair(("c", "d"), 40.0, size=128 * MiB),
             _pair(("a", "c"), 100.0, "pairs-2", 128 * MiB), _pair(("b", "d"), 45.0, "pairs-2", 128 * MiB)]
    assert [f.nodes for f in judge.blame_pairs(pairs, expectation)] == [("d",)]
    assert judge.blame_pairs([_pair(("a", "b"), 70.0, size=128 * MiB)], expectation) == []


def _world(nodes, ranks, busbw, wrong=0, size=128 * MiB):
    seconds = size / (busbw * 1e9) if busbw else 1.0
    return GroupResult("world", tuple(nodes), ranks, (SizeResult(size, seconds * 1e6, 0.0, busbw, wrong),))


def test_below_the_published_floor_fails_even_when_no_node_is_to_blame():
    expectation = Expectation(128 * MiB, 122.6, 0.5, "CSCS 122.6 GB/s")
    report = judge.decide(_world(["a", "b"], 8, 5.4), [], [], expectation, [], 3.0, "nccl")
    assert not report.ok and report.bad_nodes == ()
    assert "busbw 5.40 GB/s at 128 MiB is below the floor 61.3 GB/s (0.5 x 122.6 GB/s, CSCS 122.6 GB/s)" in report.verdict
    assert judge.decide(_world(["a", "b"], 8, 110.0), [], [], expectation, [], 3.0, "nccl").ok


def test_a_socket_fallback_on_one_node_names_it_whatever_the_figures():
    report = judge.decide(_world(["a", "b", "c"], 12, 200.0), [], [], None, ["b"], 2.0, "nccl")
    assert not report.ok and report.bad_nodes == ("b",)
    assert "node b: NCCL uses TCP sockets (expected RDMA" in report.verdict


def test_a_socket_fallback_everywhere_is_a_setup_problem_not_a_node():
    report = judge.decide(_world(["a", "b"], 8, 200.0), [], [], None, ["a", "b"], 2.0, "nccl")
    assert not report.ok and report.bad_nodes == ()
    assert "TCP sockets on every node" in report.verdict


def test_a_corrupting_node_is_named_with_its_wrong_element_count():
    node = GroupResult("node", ("n2",), 2, (SizeResult(MiB, 1.0, 1.0, 1.0, 7), SizeResult(4 * MiB, 1.0, 1.0, 1.0, 7)))
    clean = GroupResult("node", ("n1",), 2, (SizeResult(MiB, 1.0, 1.0, 1.0, 0),))
    report = judge.decide(_world(["n1", "n2"], 4, 1.0, wrong=7), [clean, node], [], None, [], 1.0, "gloo")
    assert report.bad_nodes == ("n2",)
    assert "node n2: 14 wrong element(s) in 2 all-reduce(s) within the node (expected 0 wrong)" in report.verdict
    assert "nccl#2001" in report.verdict


def test_wrong_data_no_node_reproduces_still_fails():
    report = judge.decide(_world(["n1", "n2"], 4, 1.0, wrong=3), [], [], None, [], 1.0, "gloo")
    assert not report.ok and report.bad_nodes == () and "3 wrong element(s)" in report.verdict


def test_a_pass_is_one_line_with_the_figures():
    report = judge.decide(_world(["n1", "n2"], 4, 1.5), [], [], None, [], 2.25, "gloo on cpu")
    assert report.ok
    assert report.verdict == "fabric gate: PASS in 2.2 s on 2 node(s), 4 ranks: busbw 1.500 GB/s at 128 MiB, #wrong 0"


@pytest.mark.parametrize(("wrong", "busbw", "sockets", "nodes", "expectation", "narrow"), [
    (0, 100.0, [], 2, None, False),      # nothing to compare two nodes against
    (0, 100.0, [], 3, None, True),       # relative judgement needs the pair rounds
    (0, 100.0, [], 3, Expectation(128 * MiB, 122.6, 0.5, "x"), False),
    (0, 10.0, [], 2, Expectation(128 * MiB, 122.6, 0.5, "x"), True),
    (1, 100.0, [], 2, None, True),
    (0, 100.0, ["a"], 2, None, True),
])
def test_narrowing_runs_on_a_failure_or_where_only_a_comparison_can_judge(wrong, busbw, sockets, nodes,
                                                                         expectation, narrow):
    world = _world([f"n{i}" for i in range(nodes)], nodes, busbw, wrong)
    assert judge.needs_narrowing(world, expectation, sockets, nodes) is narrow


def test_the_report_is_written_as_json_and_text(tmp_path):
    report = judge.decide(_world(["n1", "n2"], 4, 1.5), [], [], None, [], 2.0, "gloo on cpu", ["a note"])
    judge.write_report(report, str(tmp_path))
    data = json.loads((tmp_path / judge.GATE_JSON).read_text())
    assert data["ok"] and data["world"]["sizes"][0]["busbw_gbps"] == 1.5 and data["notes"] == ["a note"]
    text = (tmp_path / judge.GATE_TEXT).read_text()
    assert text.splitlines()[-1] == report.verdict and "busbw = algbw * 2(n-1)/n" in text
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_site_profile_expectation_carries_its_source():
    profile = {"size_bytes": 134217728, "busbw_gbps": 122.6, "floor_fraction": 0.5, "source": "CSCS",
               "sockets_busbw_gbps": 5.4, "backend": "nccl", "device": "cuda"}
    expectation = judge.expectation_from_profile(profile)
    assert expectation == Expectation(128 * MiB, 122.6, 0.5, "CSCS", 5.4, "nccl", "cuda")
    assert expectation.floor_gbps == pytest.approx(61.3)
    assert judge.expectation_from_profile(None) is None


def _measured_in_turn(*figures_by_pair):
    """A measure_round for judge.remeasured: each call measures the round's pairs at their next figure."""
    calls = []

    def measure_round(name):
        calls.append(name)
        return [_pair(nodes, figures[len([c for c in calls if c == name]) - 1], name)
                for nodes, figures, round_name in figures_by_pair if round_name == name]
    return measure_round, calls


def test_a_pair_slow_twice_and_fast_the_third_time_names_no_node():
    # The figures of a healthy pair whose ranks a loaded 2-core machine descheduled twice (0.025, 0.071).
    first = [_pair(("node2", "node3"), 0.329), _pair(("node2", "node4"), 0.025, "pairs-2"),
             _pair(("node3", "node4"), 0.300, "pairs-3")]
    measure_round, calls = _measured_in_turn((("node2", "node4"), (0.071, 0.310), "pairs-2"))
    kept, notes = judge.remeasured(first, None, measure_round)
    assert calls == ["pairs-2", "pairs-2"]
    assert judge.blame_pairs(kept, None) == []
    assert [n.split(": ")[1] for n in notes] == ["busbw 0.025 then 0.071 GB/s at 4 MiB; the faster is judged",
                                                 "busbw 0.071 then 0.310 GB/s at 4 MiB; the faster is judged"]


def test_a_pair_slow_every_time_is_measured_three_times_in_all_and_named():
    # n3's NIC is bad: each of its pairs is slow in every round, every measurement.
    first = [_pair(("n1", "n2"), 0.5), _pair(("n3", "n4"), 0.02), _pair(("n1", "n3"), 0.02, "pairs-2"),
             _pair(("n2", "n4"), 0.5, "pairs-2"), _pair(("n1", "n4"), 0.5, "pairs-3"), _pair(("n2", "n3"), 0.03, "pairs-3")]
    measure_round, calls = _measured_in_turn((("n3", "n4"), (0.03, 0.02), "pairs-1"),
                                             (("n1", "n3"), (0.03, 0.02), "pairs-2"),
                                             (("n2", "n3"), (0.02, 0.03), "pairs-3"))
    kept, notes = judge.remeasured(first, None, measure_round)
    assert judge.PAIR_MEASUREMENTS == 3 and sorted(calls) == ["pairs-1", "pairs-1", "pairs-2", "pairs-2", "pairs-3",
                                                              "pairs-3"]
    (fault,) = judge.blame_pairs(kept, None)
    assert fault.nodes == ("n3",) and len(notes) == 6


def test_a_gate_with_every_pair_fast_measures_nothing_again():
    first = [_pair(("a", "b"), 1.0), _pair(("c", "d"), 0.9)]
    measure_round, calls = _measured_in_turn()
    assert judge.remeasured(first, None, measure_round) == (first, ())
    assert calls == []
