"""Fixtures for the trainer's tests: small generated datasets in the real on-disk format."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_train.synthetic import write_dataset


@pytest.fixture(scope="session")
def ten_class_data(tmp_path_factory) -> Path:
    """600 train / 203 test images (203 is odd: not divisible by a world of 2), labels 0..9."""
    root = tmp_path_factory.mktemp("cifar10class")
    write_dataset(root, train=600, test=203, seed=3, classes=10)
    return root
