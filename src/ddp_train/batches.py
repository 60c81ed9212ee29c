"""This rank's training batches: each epoch's shuffle (the same on every rank) and each step's
slice of it, augmented with a seed taken from the step's position, so a resumed run replays them.
"""

from __future__ import annotations

import torch

from ddp_train.augment import random_crop_flip
from ddp_train.config import batch_per_rank
from ddp_train.data import Split, normalize

CROP_PADDING = 4


def step_seed(seed: int, epoch: int, step: int, rank: int) -> int:
    """Augmentation randomness is a function of the position, so a resumed run replays it."""
    prime = 1_000_003
    return (((seed * prime + epoch) * prime + step) * prime + rank) % (2**63)


def epoch_permutation(n: int, seed: int, epoch: int, device: torch.device) -> torch.Tensor:
    """The same shuffle on every rank (a CPU generator: identical on any device)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g).to(device)


class TrainBatches:
    """Rank r takes the r-th slice of every global batch; augmentation runs on the batch's device."""

    def __init__(self, train_set: Split, batch_size: int, seed: int, rank: int, world_size: int):
        self.images, self.labels = train_set.images, train_set.labels
        self.batch_size, self.seed, self.rank = batch_size, seed, rank
        self.per_rank = batch_per_rank(batch_size, world_size)
        self.generator = torch.Generator(device=train_set.images.device)

    def permutation(self, epoch: int) -> torch.Tensor:
        return epoch_permutation(len(self.labels), self.seed, epoch, self.images.device)

    def batch(self, perm: torch.Tensor, epoch: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = step * self.batch_size + self.rank * self.per_rank
        idx = perm[start:start + self.per_rank]
        self.generator.manual_seed(step_seed(self.seed, epoch, step, self.rank))
        return normalize(random_crop_flip(self.images[idx], CROP_PADDING, self.generator)), self.labels[idx]
