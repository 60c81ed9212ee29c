"""The guide's WideResNet: its published size at full width, a usable narrow version."""

import torch

from ddp_train.recipe.model import WideResNet, scaled_widths


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_full_width_matches_the_guides_17_17_million_parameters():
    assert scaled_widths(1.0) == (16, 160, 320, 640)
    assert round(parameter_count(WideResNet(100, 1.0)) / 1e6, 2) == 17.17


def test_width_scale_shrinks_the_model_and_keeps_the_output_shape():
    narrow = WideResNet(100, 1 / 16)
    assert parameter_count(narrow) < 100_000
    x = torch.randn(2, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    assert narrow(x).shape == (2, 100)


def test_dropout_is_inside_the_residual_blocks():
    model = WideResNet(100, 1 / 16, dropout=0.01)
    rates = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert rates == [0.01] * 6  # two blocks in each of three stages
