"""Step times per rank and the straggler rule: who is named, with which figure."""

from __future__ import annotations

import pytest
import torch

from ddp_train.errors import TrainError
from ddp_train.safety.steptime import STRAGGLER_THRESHOLD, RankTimes, StepClock, stragglers, slowdown_s_for_tests


def rank(r: int, compute: float, node: str = "node1", wait: float = 5.0) -> RankTimes:
    return RankTimes(r, node, 100, compute + wait, compute, wait, ())


def test_a_rank_over_the_others_median_by_more_than_the_threshold_is_named_with_its_figures():
    found = stragglers([rank(0, 100), rank(1, 101), rank(2, 99), rank(3, 150, "node2", wait=1.0)])
    assert [s.who for s in found] == ["rank 3 on node2"]
    assert found[0].median_ms == 100 and found[0].over == pytest.approx(0.5)
    assert found[0].line().startswith("Straggler: rank 3 on node2 computes 150.0 ms per step, 50% over")


def test_with_two_ranks_the_slow_one_is_compared_with_the_other_not_with_their_mean():
    # 146 is 19 % over the mean of 100 and 146 (under the threshold) but 46 % over the other rank.
    assert [s.who for s in stragglers([rank(0, 100), rank(1, 146)])] == ["rank 1 on node1"]


def test_differences_within_the_threshold_name_nobody():
    slow = 100 * (1 + STRAGGLER_THRESHOLD) - 1
    assert stragglers([rank(0, 100), rank(1, 100), rank(2, slow)]) == []


def test_a_node_whose_every_rank_is_slow_is_named_once_as_the_node():
    ranks = [rank(0, 100), rank(1, 100), rank(2, 130, "node2"), rank(3, 130, "node2"),
             rank(4, 100, "node3"), rank(5, 100, "node3")]
    found = stragglers(ranks)
    assert [(s.who, s.compute_ms, s.median_ms) for s in found] == [("node node2", 130, 100)]


def test_a_node_with_one_rank_far_slower_than_its_other_is_no_slow_node_each_slow_rank_is_named():
    # A run of the e2e suite under load (compute ms per step): rank 3 slept 1 s a step, and rank 2 was
    # 21 % over the others by noise. As a node, node2 was "952 ms" (their mean), which neither rank took.
    ranks = [rank(0, 400.9), rank(1, 395.0), rank(2, 484.2, "node2"), rank(3, 1420.6, "node2")]
    assert [s.who for s in stragglers(ranks)] == ["rank 2 on node2", "rank 3 on node2"]
    # Slow alike (each within the threshold of the node's median), the node is named once.
    alike = [rank(0, 100), rank(1, 100), rank(2, 135, "node2"), rank(3, 155, "node2")]
    assert [s.who for s in stragglers(alike)] == ["node node2"]


def test_a_world_of_one_has_no_straggler():
    assert stragglers([rank(0, 100)]) == []


def test_the_clock_splits_a_step_into_compute_and_the_wait_after_the_last_bucket(monkeypatch):
    now = iter([0.0, 0.010, 0.030, 0.070, 0.075])  # begin, forward, bucket, backward end, end
    monkeypatch.setattr("ddp_train.safety.steptime.time.perf_counter", lambda: next(now))
    clock = StepClock(torch.device("cpu"))
    clock.begin()
    clock.forward_started()   # 10 ms in DDP's buffer broadcast: waiting
    clock.bucket()
    clock.backward_done()     # 40 ms after the last bucket: waiting
    clock.end()
    clock.epoch_end()
    times = clock.times(0, "node1")
    assert times.step_ms == pytest.approx(75)
    assert times.wait_ms == pytest.approx(50)
    assert times.compute_ms == pytest.approx(25)
    assert times.step_ms_per_epoch == (75.0,)


def test_a_disabled_clock_times_nothing():
    clock = StepClock(torch.device("cpu"), enabled=False)
    clock.begin()
    clock.bucket()
    clock.end()
    assert clock.times(0, "n") is None


def test_the_test_only_slowdown_applies_to_its_rank_alone_and_a_malformed_one_is_refused():
    assert slowdown_s_for_tests({"DDP_TEST_SLOW_RANK": "3:0.5"}, 3) == 0.5
    assert slowdown_s_for_tests({"DDP_TEST_SLOW_RANK": "3:0.5"}, 2) == 0.0
    assert slowdown_s_for_tests({}, 3) == 0.0
    with pytest.raises(TrainError, match="RANK:SECONDS"):
        slowdown_s_for_tests({"DDP_TEST_SLOW_RANK": "three"}, 3)
