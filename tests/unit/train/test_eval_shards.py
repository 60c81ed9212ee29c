"""Evaluation shards cover the test set exactly once, whatever the world size."""

import pytest
import torch

from ddp_train.recipe.data import Split
from ddp_train.recipe.evaluate import evaluate, shard_bounds


@pytest.mark.parametrize("n", [1, 7, 203, 10000])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_shards_cover_every_index_once(n, world):
    covered = [i for r in range(world) for i in range(*shard_bounds(n, r, world))]
    assert covered == list(range(n))
    sizes = [shard_bounds(n, r, world)[1] - shard_bounds(n, r, world)[0] for r in range(world)]
    assert max(sizes) - min(sizes) <= 1


class ConstantClass(torch.nn.Module):
    def __init__(self, label: int):
        super().__init__()
        self.label = label

    def forward(self, x):
        logits = torch.zeros(x.shape[0], 100)
        logits[:, self.label] = 10.0
        return logits


def test_accuracy_and_count_are_the_whole_sets_in_a_world_of_one():
    labels = torch.tensor([3] * 5 + [4] * 6)
    split = Split(torch.zeros(11, 3, 32, 32, dtype=torch.uint8), labels)
    result = evaluate(ConstantClass(3), split, rank=0, world_size=1, batch_size=4,
                      autocast_dtype=None, tta=True)
    assert (result.correct, result.total) == (5, 11)
    assert result.accuracy == pytest.approx(5 / 11)
