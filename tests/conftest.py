"""Every suite's shared hooks: each test's CPU-seconds, the heaviest printed at the end (tests/cpu_accounting.py)."""
from __future__ import annotations

import cpu_accounting


def pytest_addoption(parser):
    cpu_accounting.pytest_addoption(parser)


def pytest_configure(config):
    config.pluginmanager.register(cpu_accounting.CpuAccounting(config), "cpu-accounting")
