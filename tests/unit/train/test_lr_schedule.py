"""Learning-rate schedule: linear warm-up, then the chosen decay."""

import pytest

from ddp_train.recipe.learner import lr_at


def test_warmup_rises_linearly_to_the_peak():
    assert [lr_at(s, 100, 4, 1.0, "cosine") for s in range(4)] == [0.25, 0.5, 0.75, 1.0]


@pytest.mark.parametrize("schedule,end", [("cosine", 0.0), ("linear", 0.0), ("constant", 1.0)])
def test_decay_reaches_its_end_value(schedule, end):
    assert lr_at(100, 100, 10, 1.0, schedule) == pytest.approx(end)
    assert lr_at(55, 100, 10, 1.0, schedule) == pytest.approx(0.5 if schedule != "constant" else 1.0)
