"""The host half of the launcher runs on SLES 15's python3 (3.6.15): exactly the modules in
entrypoints/host-modules.txt load there, and vermin finds nothing newer than 3.6 in them."""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from elf_tree import build_fake_olivia_host

REPO = Path(__file__).resolve().parents[3]
HOST_MODULES_FILE = REPO / "entrypoints" / "host-modules.txt"
HOST_ENTRY = "ddp_launch.binds"  # what slurm/lib/ddp.sh runs: python3 -m ddp_launch.binds


def listed_files() -> list[str]:
    lines = HOST_MODULES_FILE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def listed_modules() -> set[str]:
    return {f[:-len(".py")].replace("/", ".").removesuffix(".__init__") for f in listed_files()}


def python36() -> str | None:
    """SLES 15's interpreter version, where this machine has one (pyenv's real binary, not a shim)."""
    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.6*/bin/python3.6")))
    return found[0] if found else None


PYTHON36 = python36()


@pytest.fixture(scope="module")
def fake_host(tmp_path_factory) -> Path:
    return build_fake_olivia_host(tmp_path_factory.mktemp("hostmods") / "host")["root"]


# `python -m ENTRY ARGS` (runpy, as -m does it), then the ddp_launch modules in sys.modules.
# Python 3.6 has no -X importtime, so the list comes from the interpreter itself.
RUN_AND_LIST = """
import runpy, sys
sys.argv[0] = "ENTRY"
try:
    runpy.run_module("ENTRY", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
print("MODULES " + " ".join(sorted(m for m in sys.modules if m.startswith("ddp_launch"))), file=sys.stderr)
sys.exit(code)
""".replace("ENTRY", HOST_ENTRY)


def imported_ddp_launch_modules(python: str, root: Path) -> set[str]:
    """Every ddp_launch module the host entry imports when it runs the whole closure."""
    result = subprocess.run(
        [python, "-c", RUN_AND_LIST, "--site", "olivia", "--root", str(root)],
        env={"PYTHONPATH": str(REPO / "entrypoints"), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "added " in result.stderr  # the closure ran, so its modules were imported
    line = next(line for line in result.stderr.splitlines() if line.startswith("MODULES "))
    return set(line.split()[1:]) | {HOST_ENTRY}


def test_host_entry_imports_exactly_the_listed_modules(fake_host):
    imported = imported_ddp_launch_modules(sys.executable, fake_host)
    unlisted = imported - listed_modules()
    assert not unlisted, f"the host entry imports {sorted(unlisted)}: add them to {HOST_MODULES_FILE} (and keep them 3.6-safe)"
    assert listed_modules() == imported, "host-modules.txt lists modules the host entry no longer imports"


def test_listed_host_modules_pass_vermin_for_python_36():
    if importlib.util.find_spec("vermin") is None or not (Path(sys.executable).parent / "vermin").exists():
        pytest.skip("vermin not installed (it is in the test extra: pip install -e '.[test]')")
    result = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "--target=3.6-", "--violations", "--no-tips", *listed_files()],
        cwd=REPO / "entrypoints", capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("module", listed_files())
def test_host_modules_import_only_the_standard_library(module):
    import ast

    tree = ast.parse((REPO / "entrypoints" / module).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"ddp_launch"}


@pytest.mark.skipif(PYTHON36 is None, reason="no python3.6 interpreter here (pyenv install 3.6.15 to run it)")
def test_job_script_host_call_runs_on_python_36(fake_host, tmp_path):
    """slurm/lib/ddp.sh's own function, with SLES 15's python3 first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(PYTHON36)
    script = 'source "$DDP_REPO/slurm/lib/ddp.sh"; ddp::launcher_on_host binds --site olivia --root "$ROOT"'
    result = subprocess.run(
        ["bash", "-c", script],
        env={"DDP_REPO": str(REPO), "ROOT": str(fake_host), "PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"{fake_host}/opt/cray/libfabric/2.3.1:/opt/libfabric" in result.stdout
    assert f"{fake_host}/usr/lib64/libfakenl-3.so.200:/opt/host-libs/libfakenl-3.so.200" in result.stdout


@pytest.mark.skipif(PYTHON36 is None, reason="no python3.6 interpreter here (pyenv install 3.6.15 to run it)")
def test_python_36_imports_exactly_the_listed_modules(fake_host):
    assert imported_ddp_launch_modules(PYTHON36, fake_host) == listed_modules()
