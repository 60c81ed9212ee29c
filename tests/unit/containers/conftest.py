"""Fixtures for the container tests."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from definitions_paths import REPO  # noqa: E402


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def venv_bin() -> Path:
    return Path(sys.executable).parent
