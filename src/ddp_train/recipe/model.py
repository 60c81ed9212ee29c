"""The Olivia guide's WideResNet for CIFAR-100, with a width multiplier for CPU runs and tests.

The guide's model.py is not in its text; this is the common form that matches its facts and
its published size (17.17 M parameters, 2.41 GMAC per 32x32 image at width 1.0): a 3x3 stem
conv to 16 channels, then three stages of widths 160, 320, 640 at 32, 16 and 8 pixels, each
two post-activation basic blocks (conv3x3-BN-ReLU, dropout, conv3x3-BN, add, ReLU) with a 1x1
conv projection on the shortcut where the width changes, 2x2 max-pool between stages, global
average pool and a linear head.
"""

from __future__ import annotations

import torch
import torch.nn as nn

GUIDE_WIDTHS = (16, 160, 320, 640)
MIN_WIDTH = 4


def scaled_widths(width_scale: float) -> tuple[int, ...]:
    return tuple(max(MIN_WIDTH, round(w * width_scale)) for w in GUIDE_WIDTHS)


def conv3x3(cin: int, cout: int) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, kernel_size=3, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, dropout: float):
        super().__init__()
        self.conv1 = conv3x3(cin, cout)
        self.bn1 = nn.BatchNorm2d(cout)
        # No module at all for 0: dropout with p=0 can still launch a mask kernel per block.
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.conv2 = conv3x3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if cin == cout else nn.Conv2d(cin, cout, 1, bias=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.relu(self.bn1(self.conv1(x))))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class WideResNet(nn.Module):
    def __init__(self, num_classes: int = 100, width_scale: float = 1.0, dropout: float = 0.01,
                 blocks_per_stage: int = 2, block: type[BasicBlock] = BasicBlock):
        super().__init__()
        stem, *stage_widths = scaled_widths(width_scale)
        self.stem = nn.Sequential(conv3x3(3, stem), nn.BatchNorm2d(stem), nn.ReLU(inplace=True))
        layers: list[nn.Module] = []
        cin = stem
        for i, width in enumerate(stage_widths):
            if i > 0:
                layers.append(nn.MaxPool2d(2))
            for _ in range(blocks_per_stage):
                layers.append(block(cin, width, dropout))
                cin = width
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stages(self.stem(x)))
        return self.head(torch.flatten(x, 1))
