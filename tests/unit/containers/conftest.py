"""Fixtures for the container tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from definitions_paths import REPO


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def venv_bin() -> Path:
    return Path(sys.executable).parent
