"""Fixtures for the fabric tests: a fake node tree under tmp_path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_node import FakeNode  # noqa: E402


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path / "node")
