"""Paths the container tests share: the repository, its definition files (imported, not a fixture)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONTAINERS = REPO / "containers"
DEFINITIONS = ("gpu.def", "cpu.def")
# The images the Makefile builds: definition file and --build-arg values (build-olivia, build-lumi,
# build-x86, build-cpu).
BUILDS = {
    "olivia": ("gpu.def", {"ARCH": "arm64", "SITE": "olivia"}),
    "lumi": ("gpu.def", {"ARCH": "amd64", "SITE": "lumi"}),
    "x86": ("gpu.def", {"ARCH": "amd64"}),
    "cpu": ("cpu.def", {}),
}
