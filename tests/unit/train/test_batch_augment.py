"""Batched crop + flip: every output is one of torchvision's RandomCrop(pad 4)/flip results."""

import torch
import torch.nn.functional as F

from ddp_train.recipe.data import random_crop_flip


def candidate_views(image: torch.Tensor, pad: int) -> list[torch.Tensor]:
    padded = F.pad(image, (pad,) * 4)
    views = []
    for top in range(2 * pad + 1):
        for left in range(2 * pad + 1):
            crop = padded[:, top:top + 32, left:left + 32]
            views += [crop, crop.flip(2)]
    return views


def test_each_image_is_a_zero_padded_crop_or_its_mirror():
    images = torch.randint(1, 256, (16, 3, 32, 32), dtype=torch.uint8)  # no zeros: padding shows
    out = random_crop_flip(images, 4, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.uint8
    for image, augmented in zip(images, out):
        assert any(torch.equal(augmented, view) for view in candidate_views(image, 4))


def test_offsets_and_flips_vary_across_the_batch():
    images = torch.randint(1, 256, (64, 3, 32, 32), dtype=torch.uint8)
    out = random_crop_flip(images, 4, torch.Generator().manual_seed(1))
    chosen = [next(i for i, view in enumerate(candidate_views(image, 4)) if torch.equal(a, view))
              for image, a in zip(images, out)]
    flips = {i % 2 for i in chosen}
    offsets = {i // 2 for i in chosen}
    assert flips == {0, 1} and len(offsets) > 20  # 81 offsets: 64 draws hit well over 20


def test_same_seed_gives_the_same_batch():
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    a = random_crop_flip(images, 4, torch.Generator().manual_seed(5))
    b = random_crop_flip(images, 4, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
