"""The job scripts' host calls run on SLES 15's python3 (3.6.15): together they load exactly the
modules in entrypoints/host-modules.txt, and vermin finds nothing newer than 3.6 in them."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes.elf_tree import build_fake_olivia_host

REPO = Path(__file__).resolve().parents[3]
HOST_MODULES_FILE = REPO / "entrypoints" / "host-modules.txt"
HOST_PACKAGES = ("ddp_launch", "ddp_contract")


@dataclass(frozen=True)
class HostEntry:
    """One `python3 -m RUN ARGS...` that slurm/lib/ddp.sh runs on the host, and its own module
    (runpy runs it as __main__, so sys.modules does not list it under its name)."""

    run: str
    module: str
    args: tuple


def host_entries(root: Path, data_dir: Path) -> tuple:
    return (
        HostEntry("ddp_launch.binds", "ddp_launch.binds", ("--site", "olivia", "--root", str(root))),
        HostEntry("ddp_contract", "ddp_contract.__main__", ("dataset", str(data_dir))),
        # `make data` on the login node; a URL that answers nothing, so the run stops in fetch().
        HostEntry("ddp_contract", "ddp_contract.__main__",
                  ("download", str(data_dir / "fetched"), "--url", (data_dir / "absent.tar.gz").as_uri())),
        HostEntry("ddp_contract.quarantine", "ddp_contract.quarantine", ("show", str(data_dir))),
        HostEntry("ddp_contract", "ddp_contract.__main__", ("run-dir-lock", str(data_dir))),
        HostEntry("ddp_contract.shell_words", "ddp_contract.shell_words",
                  ("ddp", "DDP_TRAIN_ARGS", "--note 'two words'")),
        # ddp.sh asks for the site's Apptainer GPU flag (--nv, --rocm).
        HostEntry("ddp_launch.accelerators", "ddp_launch.accelerators", ("--site", "lumi", "apptainer-flag")),
        # ddp.sh asks for the site's srun options for its training and gate steps.
        HostEntry("ddp_launch.sites", "ddp_launch.sites", ("--site", "olivia", "srun-args")),
        # ddp.sh asks which nodes train and which wait as spares (DDP_SPARE_NODES).
        HostEntry("ddp_contract.spares", "ddp_contract.spares", ("place", str(data_dir), "1", "node1", "node2")),
        # ddp.sh reads the workload from the job's arguments: a script that is not there, named in one line.
        HostEntry("ddp_contract.workload_choice", "ddp_contract.workload_choice",
                  ("--check-file", "ddp", "0", "--script", str(data_dir / "absent.py"), "--lr", "1")),
        # ddp.sh (and runai/submit.sh) ask whether the run's checkpoint takes the trainer flags.
        HostEntry("ddp_contract", "ddp_contract.__main__", ("resume-check", str(data_dir), "--", "--epochs", "3")),
    )


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


@pytest.fixture(scope="module")
def partial_data(tmp_path_factory) -> Path:
    """A data directory with only the training file: the dataset check reports the rest."""
    data_dir = tmp_path_factory.mktemp("hostdata")
    (data_dir / "cifar-100-python").mkdir()
    (data_dir / "cifar-100-python" / "train").write_bytes(b"")
    return data_dir


# `python -m ENTRY ARGS` (runpy, as -m does it), then our packages' modules in sys.modules.
# Python 3.6 has no -X importtime, so the list comes from the interpreter itself.
RUN_AND_LIST = """
import runpy, sys
sys.argv[0] = "ENTRY"
code = 0
try:
    runpy.run_module("ENTRY", run_name="__main__", alter_sys=True)
except SystemExit as stop:
    code = stop.code
print("MODULES " + " ".join(sorted(m for m in sys.modules if m.split(".")[0] in PACKAGES)), file=sys.stderr)
sys.exit(code)
"""


def imported_modules(python: str, entry: HostEntry) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The run of one host entry, and every module of our packages it imported."""
    program = RUN_AND_LIST.replace("ENTRY", entry.run).replace("PACKAGES", repr(HOST_PACKAGES))
    result = subprocess.run(
        [python, "-c", program, *entry.args],
        env={"PYTHONPATH": str(REPO / "entrypoints"), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
    )
    line = next(line for line in result.stderr.splitlines() if line.startswith("MODULES "))
    return result, set(line.split()[1:]) | {entry.module}


def imported_by_every_entry(python: str, root: Path, data_dir: Path) -> set[str]:
    """The union over the host entries, each run down its whole path."""
    binds, dataset, download, quarantine, run_dir_lock, shell_words, accelerator, srun, spares, workload, resume = host_entries(
        root, data_dir)
    result, imported = imported_modules(python, binds)
    assert result.returncode == 0, result.stderr
    assert "added " in result.stderr  # the closure ran, so its modules were imported
    result, more = imported_modules(python, dataset)
    assert result.returncode == 1, result.stderr
    assert result.stdout == f"{data_dir}/cifar-100-python lacks test, meta\n"  # it checked and reported
    result, fetched = imported_modules(python, download)
    assert result.returncode == 1 and "could not download" in result.stderr, result.stderr
    result, record = imported_modules(python, quarantine)
    assert result.returncode == 0, result.stderr
    result, lock = imported_modules(python, run_dir_lock)
    assert result.returncode == 0, result.stderr  # no lock there: the run dir is free
    result, words = imported_modules(python, shell_words)
    assert result.returncode == 0 and result.stdout == "--note\0two words\0\0", result.stderr
    result, vendor = imported_modules(python, accelerator)
    assert result.returncode == 0 and result.stdout == "--rocm\n", result.stderr
    result, site = imported_modules(python, srun)
    assert result.returncode == 0 and result.stdout == "--network=disable_rdzv_get\n", result.stderr
    result, placed = imported_modules(python, spares)
    assert result.returncode == 0 and result.stdout.startswith("train=node1\n"), result.stderr
    result, resumable = imported_modules(python, resume)
    assert result.returncode == 0, result.stderr  # no checkpoint there: nothing binds the flags
    result, chosen = imported_modules(python, workload)
    assert result.returncode == 2 and result.stderr.startswith(f"ddp: error: --script {data_dir}/absent.py is not a file"), \
        result.stderr
    return imported | more | fetched | record | lock | words | vendor | site | placed | chosen | resumable


def test_host_entries_import_exactly_the_listed_modules(fake_host, partial_data):
    imported = imported_by_every_entry(sys.executable, fake_host, partial_data)
    unlisted = imported - listed_modules()
    assert not unlisted, f"the host entries import {sorted(unlisted)}: add them to {HOST_MODULES_FILE} (and keep them 3.6-safe)"
    assert listed_modules() == imported, "host-modules.txt lists modules no host entry imports any more"


def test_job_scripts_run_exactly_the_host_entries_tested_here():
    # A new `ddp::on_host MODULE` call in slurm/lib/ddp.sh must join host_entries above.
    library = (REPO / "slurm" / "lib" / "ddp.sh").read_text()
    called = set(re.findall(r"ddp::on_host (\w[\w.]*)", library))
    assert called == {entry.run for entry in host_entries(Path("/"), Path("/"))}


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
    assert imported <= set(sys.stdlib_module_names) | set(HOST_PACKAGES)


@pytest.mark.skipif(PYTHON36 is None, reason="no python3.6 interpreter here (pyenv install 3.6.15 to run it)")
def test_job_script_host_call_runs_on_python_36(fake_host, tmp_path):
    """slurm/lib/ddp.sh's own function, with SLES 15's python3 first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(PYTHON36)
    script = 'source "$DDP_REPO/slurm/lib/ddp.sh"; ddp::on_host ddp_launch.binds --site olivia --root "$ROOT"'
    result = subprocess.run(
        ["bash", "-c", script],
        env={"DDP_REPO": str(REPO), "ROOT": str(fake_host), "PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert f"{fake_host}/opt/cray/libfabric/2.3.1:/opt/libfabric" in result.stdout
    assert f"{fake_host}/usr/lib64/libfakenl-3.so.200:/opt/host-libs/libfakenl-3.so.200" in result.stdout


@pytest.mark.skipif(PYTHON36 is None, reason="no python3.6 interpreter here (pyenv install 3.6.15 to run it)")
def test_job_script_dataset_check_runs_on_python_36(partial_data, tmp_path):
    """slurm/lib/ddp.sh's dataset check, with SLES 15's python3 first on PATH: one line, exit 2 (a user's
    mistake: ddp_contract.EXIT_USAGE)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(PYTHON36)
    result = subprocess.run(
        ["bash", "-c", 'source "$DDP_REPO/slurm/lib/ddp.sh"; ddp::require_data "$DATA"'],
        env={"DDP_REPO": str(REPO), "DATA": str(partial_data), "PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (f"ddp: error: {partial_data}/cifar-100-python lacks test, meta: run 'make data "
                             f"DATA_DIR={partial_data}' on the login node, or set DDP_DATA_DIR\n")


@pytest.mark.skipif(PYTHON36 is None, reason="no python3.6 interpreter here (pyenv install 3.6.15 to run it)")
def test_python_36_imports_exactly_the_listed_modules(fake_host, partial_data):
    assert imported_by_every_entry(PYTHON36, fake_host, partial_data) == listed_modules()
