"""ddp-bench is a package of its own: it starts without torch (a login node or a laptop reads
the metrics), its two reports do not import each other, and the console script points at it."""

from __future__ import annotations

import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def modules_after_import(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_ddp_bench_starts_without_torch():
    assert "torch" not in modules_after_import("ddp_bench.cli")


@pytest.mark.parametrize("module,other", [("ddp_bench.report", "ddp_bench.gpumon"),
                                          ("ddp_bench.gpumon", "ddp_bench.report")])
def test_the_two_reports_do_not_import_each_other(module, other):
    assert other not in modules_after_import(module)


def test_the_console_script_is_ddp_bench_cli_main():
    with open(REPO / "pyproject.toml", "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["ddp-bench"]
    module, _, name = target.partition(":")

    main = getattr(importlib.import_module(module), name)

    assert main(["gpu", "--help-is-no-flag"]) == 2  # a real argparse, one-line errors


def test_python_m_ddp_bench_is_the_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ddp_bench", "report", str(tmp_path / "missing")],
                          capture_output=True, text=True, cwd=tmp_path)

    assert done.returncode == 2
    assert done.stderr.startswith("ddp-bench: error: ") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
