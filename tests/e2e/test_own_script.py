"""One's own training script in the image by hand, with the real Apptainer as the cluster's test user: the
README's `apptainer run IMAGE --script ...` as written, a script the container cannot see named with the
bind that shows it, and a package added through a venv made in the image (DDP_VENV). The job scripts run
the examples on each cluster's twin (tests/e2e/test_twin_*.py)."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path

import documented_blocks
import pytest
from conftest import REPO, user_dir

pytestmark = pytest.mark.e2e


def checkout_like(tmp_path: Path, sif: Path) -> Path:
    """A directory as a user's checkout has it for these commands: the examples, and the CPU image under the
    name `make build-cpu` gives it (the e2e images are built elsewhere, once)."""
    where = user_dir(tmp_path / "checkout")
    shutil.copytree(REPO / "examples", where / "examples")
    (where / "train-cpu.sif").symlink_to(sif)
    subprocess.run(["chmod", "-R", "a+rX", str(where)], check=True)
    return where


def test_the_readme_runs_ones_own_script_in_apptainer_by_hand_as_written(cluster, images, tmp_path):
    block = documented_blocks.own_script_apptainer_block()
    where = checkout_like(tmp_path, images.cpu)

    done = cluster.as_user(["bash", "-euo", "pipefail", "-c", block.text], cwd=where, timeout=600)

    assert done.returncode == 0, done.stderr
    assert "world size 2, backend gloo, steps 0-39" in done.stdout and "done: 40 steps" in done.stdout
    assert (where / "runs" / "example" / "example-checkpoint.pt").is_file()


def ours(stderr: str) -> list[str]:
    """stderr without Apptainer's own INFO lines (a tool it lacks here, fuse2fs, gocryptfs)."""
    return [line for line in stderr.splitlines() if not line.startswith("INFO:")]


def test_a_script_the_container_does_not_see_stops_in_one_line_naming_the_bind(cluster, images, tmp_path):
    # /srv of the cluster's root: a directory of the host that Apptainer does not bind by default (its home,
    # the working directory, /tmp and /var/tmp it does: Apptainer user guide, "Bind Paths and Mounts").
    hidden = Path("/srv") / f"ddp-own-script-{tmp_path.name}"
    assert cluster.run(["sh", "-c", f"mkdir -p {hidden} && cp {REPO}/examples/env_ranks.py {hidden}/ && "
                                    f"chmod -R a+rX {hidden}"]).returncode == 0
    argv = ["apptainer", "run", str(images.cpu), "--mode", "local", "--cpu-workers", "1", "--script",
            f"{hidden}/env_ranks.py"]

    done = cluster.as_user(argv, cwd=user_dir(tmp_path / "cwd"), timeout=300)

    assert done.returncode == 2, done.stderr
    (said,) = ours(done.stderr)
    assert said.startswith(f"ddp-launch: error: --script '{hidden}/env_ranks.py' is not a file here")
    assert f"does not see it: if it is on the host, bind the directory that holds it (APPTAINER_BIND={hidden}," in said
    bound = cluster.as_user(["env", f"APPTAINER_BIND={hidden}", *argv, "--", "--steps", "2"],
                            cwd=user_dir(tmp_path / "cwd"), timeout=300)
    assert bound.returncode == 0, bound.stderr
    assert "done: 2 steps" in bound.stdout


EXTRA = "ddp_e2e_extra"
USES_THE_PACKAGE = f"""
import os, sys
import {EXTRA}
print(f"rank {{os.environ['RANK']}}: {{{EXTRA}.ANSWER}} from {{{EXTRA}.__file__}} under {{sys.prefix}}", flush=True)
"""


def wheel(out: Path) -> Path:
    """A pure-Python wheel of one module (the wheel format, PEP 427: the package, then its .dist-info with
    METADATA, WHEEL and RECORD), to install with no index reachable."""
    path = out / f"{EXTRA}-1.0-py3-none-any.whl"
    info = f"{EXTRA}-1.0.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{EXTRA}/__init__.py", "ANSWER = 42\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {EXTRA}\nVersion: 1.0\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def test_a_venv_made_in_the_image_adds_a_package_the_workers_import(cluster, images, tmp_path):
    """docs/own-script.md, "Adding Python packages": the venv made in the image with --system-site-packages,
    the package installed with the image's pip, DDP_VENV naming it; a wheel of our own stands in for the
    index, which the cluster's nodes cannot reach here."""
    home = user_dir(tmp_path / "home")
    venv = home / "venvs" / "ddp"
    package = wheel(home)
    script = home / "uses_it.py"
    script.write_text(USES_THE_PACKAGE)
    subprocess.run(["chmod", "-R", "a+rX", str(home)], check=True)
    steps = [f"apptainer exec {images.cpu} python3 -m venv --system-site-packages --without-pip {venv}",
             f"apptainer exec {images.cpu} {venv}/bin/python -m pip install --no-index --no-deps {package}"]
    for step in steps:
        done = cluster.as_user(shlex.split(step), cwd=home, timeout=300)
        assert done.returncode == 0, (step, done.stderr)

    done = cluster.as_user(["apptainer", "run", str(images.cpu), "--mode", "local", "--cpu-workers", "2", "--script",
                            str(script)], cwd=home, env={"DDP_VENV": str(venv)}, timeout=300)

    assert done.returncode == 0, done.stderr
    said = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(" from ")[0] for line in said] == ["rank 0: 42", "rank 1: 42"], done.stdout
    assert all(line.endswith(f"under {venv}") and f"{venv}/lib/" in line for line in said), said
    # Without DDP_VENV the image's own Python has no such package: the workload's own error, exit 1.
    without = cluster.as_user(["apptainer", "run", str(images.cpu), "--mode", "local", "--cpu-workers", "1",
                               "--script", str(script)], cwd=home, timeout=300)
    assert without.returncode == 1 and f"No module named '{EXTRA}'" in without.stderr
