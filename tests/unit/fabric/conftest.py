"""Fixtures for the fabric tests: a fake node tree under tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.node import FakeNode


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path / "node")
