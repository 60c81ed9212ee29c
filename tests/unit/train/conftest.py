"""Fixtures for the trainer's tests: small generated datasets in the real on-disk format."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_train.synthetic import write_dataset
from train_helpers import LAUNCH_VARIABLES


@pytest.fixture(scope="session")
def ten_class_data(tmp_path_factory) -> Path:
    """600 train / 203 test images (203 is odd: not divisible by a world of 2), labels 0..9."""
    root = tmp_path_factory.mktemp("cifar10class")
    write_dataset(root, train=600, test=203, seed=3, classes=10)
    return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """64 train / 16 test images: enough for one tiny step, for tests that run cli.main in-process."""
    root = tmp_path_factory.mktemp("data")
    write_dataset(root, train=64, test=16, seed=2)
    return root


# cli.main leaves a world of several with os._exit (see ddp_train.exit_edge), which would end pytest
# itself, so in-process runs are a world of one: none of LAUNCH_VARIABLES (train_helpers) set.


@pytest.fixture
def world_of_one(monkeypatch):
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
