"""Paths the container tests share: the repository, its definition files (imported, not a fixture)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONTAINERS = REPO / "containers"
DEFINITIONS = ("olivia-arm64.def", "x86_64.def", "cpu.def")

if str(CONTAINERS) not in sys.path:
    sys.path.insert(0, str(CONTAINERS))  # containers/deffile.py and dockerfile.py are scripts, not a package
