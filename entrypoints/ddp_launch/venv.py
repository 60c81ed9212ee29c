"""DDP_VENV: run the launcher, its workers and the user's workload in a virtual environment made on the
image's Python, so that packages installed there are seen without building the image again.

Made in the image, on a file system the job sees (its path bound in, as the job scripts bind DDP_VENV):
    apptainer exec train.sif python3 -m venv --system-site-packages --without-pip /shared/me/venv
    apptainer exec train.sif /shared/me/venv/bin/python -m pip install PACKAGE
(--without-pip: the image's own pip installs into the venv, as `python -m pip` in a venv does; images whose
Python lacks ensurepip, Debian's and Ubuntu's without python3-venv, cannot make one with pip.)
--system-site-packages keeps the image's packages (torch, NCCL's bindings, this launcher) visible under the
venv's own (https://docs.python.org/3/library/venv.html: "give the virtual environment access to the system
site-packages dir"); a venv's interpreter is its bin/python, which finds pyvenv.cfg beside it at start
(https://docs.python.org/3/library/site.html). So ddp-launch starts itself again with that interpreter,
once, before anything else; the plan then runs torchrun and every worker with it (NodeFacts.python is
sys.executable), and the doctor and the fabric gate too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from ddp_launch.errors import LaunchError

VENV_VAR = "DDP_VENV"
MAKE_IT = "apptainer exec IMAGE python3 -m venv --system-site-packages --without-pip {}"


def interpreter(env: Mapping[str, str], prefix: str = sys.prefix) -> str | None:
    """The venv's Python to start ddp-launch with; None when DDP_VENV is unset or this is it already."""
    venv = env.get(VENV_VAR, "")
    if not venv:
        return None
    if os.path.realpath(venv) == os.path.realpath(prefix):
        return None
    python = os.path.join(venv, "bin", "python")
    config = os.path.join(venv, "pyvenv.cfg")
    if not os.path.isfile(config):
        raise LaunchError(f"{VENV_VAR}={venv} is not a virtual environment here (no {config}; a container sees "
                          f"only what is bound into it): make it in the image, {MAKE_IT.format(venv)}, on a file "
                          f"system the job binds, or unset {VENV_VAR}")
    if not os.path.exists(python):
        raise LaunchError(f"{VENV_VAR}={venv}: {python} does not start here (it points to "
                          f"{os.path.realpath(python)}, an interpreter this image lacks): make the venv with the "
                          f"image's own Python, {MAKE_IT.format(venv)}")
    if not sees_system_packages(config):
        raise LaunchError(f"{VENV_VAR}={venv} does not see the image's packages (torch, ddp-launch): its pyvenv.cfg "
                          f"says include-system-site-packages = false; make it again with --system-site-packages, "
                          f"{MAKE_IT.format(venv)}")
    return python


def sees_system_packages(config: str) -> bool:
    """pyvenv.cfg's include-system-site-packages (`key = value` lines, venv's own format)."""
    with open(config, encoding="utf-8") as handle:
        for line in handle:
            key, _, value = line.partition("=")
            if key.strip() == "include-system-site-packages":
                return value.strip().lower() == "true"
    return False


def run_in_venv(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Exec ddp-launch again in DDP_VENV's interpreter (returns only where there is nothing to do)."""
    python = interpreter(env)
    if python is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, [python, "-m", "ddp_launch", *argv])
