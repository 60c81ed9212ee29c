"""Training-set augmentation on whole batches, on the batch's device (never on the test set).

Random crop with 4-pixel zero padding plus horizontal flip, the Olivia guide's transforms, done as
one gather per batch instead of per-image PIL work in DataLoader workers (the guide's bottleneck).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_crop_flip(images: torch.Tensor, pad: int, generator: torch.Generator) -> torch.Tensor:
    """images: B,C,H,W (any dtype). Same result as torchvision RandomCrop(pad) + RandomHorizontalFlip."""
    b, c, h, w = images.shape
    device = images.device
    padded = F.pad(images, (pad, pad, pad, pad))
    top = torch.randint(0, 2 * pad + 1, (b, 1), device=device, generator=generator)
    left = torch.randint(0, 2 * pad + 1, (b, 1), device=device, generator=generator)
    flip = torch.rand((b, 1), device=device, generator=generator) < 0.5
    rows = top + torch.arange(h, device=device)
    cols = left + torch.arange(w, device=device)
    cols = torch.where(flip, cols.flip(1), cols)  # reading columns backwards is the flip
    batch_index = torch.arange(b, device=device).view(b, 1, 1, 1)
    channel_index = torch.arange(c, device=device).view(1, c, 1, 1)
    return padded[batch_index, channel_index, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]
