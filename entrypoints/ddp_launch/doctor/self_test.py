"""`ddp-launch doctor --image`: what an image must pass at build time (%test), on any builder.

Apptainer runs %test with the builder's environment but without --nv (--rocm), often inside a
SLURM build job (Apptainer user guide, "Definition Files", %test), so nothing here may
depend on GPUs, fabric devices, the network or the job: it checks what the image
itself carries, and fails on an image that could not train anywhere.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from typing import Callable, Mapping, Optional, Tuple

from ddp_launch import accelerators
from ddp_launch.doctor.checks import CheckFunction
from ddp_launch.doctor.context import DoctorContext
from ddp_launch.doctor.gpu import check_torch
from ddp_launch.doctor.probes import run_fresh_interpreter
from ddp_launch.doctor.report import FAIL, OK, SKIP, Check
from ddp_launch.errors import LaunchError
from ddp_launch.fabric.defaults import fabric_files, load_fabric_defaults
from ddp_launch.schedulers import env_prefixes
from ddp_launch.sites import available_sites, load_site, sites_dirs

# Variables of the build job that must not steer the launcher's self-test plan.
_SCHEDULER_PREFIXES = env_prefixes() + ("DDP_LAUNCH_",)
ENTRY_POINTS = ("ddp-launch", "ddp-train")


def check_entry_points(ctx: DoctorContext, which: Callable[..., Optional[str]] = shutil.which) -> Check:
    found = {name: which(name, path=ctx.env.get("PATH")) for name in ENTRY_POINTS}
    missing = [name for name, where in found.items() if where is None]
    if missing:
        return Check("entry points", FAIL, f"{', '.join(missing)} not on PATH",
                     "the image's %environment must put /opt/ddp/bin on PATH")
    return Check("entry points", OK, ", ".join(f"{name} = {where}" for name, where in found.items()))


def check_trainer_imports(ctx: DoctorContext, import_module: Callable[[str], object] = importlib.import_module) -> Check:
    try:
        import_module("ddp_train.train")
    except Exception as exc:  # any import failure means the image cannot train
        return Check("trainer", FAIL, f"ddp_train.train does not import: {type(exc).__name__}: {exc}",
                     "the image's %files must copy src/ddp_train and %environment put it on PYTHONPATH")
    return Check("trainer", OK, "ddp_train.train imports")


def check_site_profiles(ctx: DoctorContext) -> Check:
    env = ctx.env
    names = available_sites(env)
    if not names:
        return Check("site profiles", FAIL, f"none found in {', '.join(sites_dirs(env))}",
                     "the image's %files must copy containers/sites and set DDP_SITES_DIR")
    for name in names:
        try:
            load_site(name, env)
        except LaunchError as error:
            return Check("site profiles", FAIL, str(error), "fix the profile and rebuild")
    return Check("site profiles", OK, ", ".join(names))


def check_fabric_defaults(ctx: DoctorContext) -> Check:
    """The fabric defaults the launcher reads on every multi-node run reached the image and parse."""
    found = []
    for name in fabric_files():
        try:
            found.append(load_fabric_defaults(name, ctx.env).path)
        except LaunchError as error:
            return Check("fabric defaults", FAIL, str(error),
                         "the image's %files must copy containers/sites (with fabrics/) to /opt/ddp/sites")
    return Check("fabric defaults", OK, ", ".join(found))


def check_accelerators(ctx: DoctorContext) -> Check:
    """Every GPU vendor's data reached the image and parses: a site profile picks one at launch."""
    found = []
    for name in accelerators.ACCELERATORS:
        try:
            found.append(accelerators.load_accelerator(name, ctx.env).path)
        except LaunchError as error:
            return Check("accelerators", FAIL, str(error),
                         "the image's %files must copy containers/sites (with accelerators/) to /opt/ddp/sites")
    return Check("accelerators", OK, ", ".join(found))


def self_test_env(env: Mapping[str, str]) -> dict:
    return {k: v for k, v in env.items() if not k.startswith(_SCHEDULER_PREFIXES)}


def check_launch_plan(ctx: DoctorContext) -> Check:
    """The launcher plans a local CPU run in a fresh interpreter, as the runscript would start it."""
    argv = [sys.executable, "-m", "ddp_launch", "--dry-run", "--mode", "local", "--cpu-workers", "1"]
    try:
        done = run_fresh_interpreter(argv, self_test_env(ctx.env), timeout_s=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("launch plan", FAIL, f"cannot run ddp-launch --dry-run: {exc}", "rebuild the image")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("launch plan", FAIL, f"ddp-launch --dry-run exited {done.returncode}: {last}",
                     "rebuild the image; ddp_launch must be on PYTHONPATH")
    return Check("launch plan", OK, "ddp-launch --dry-run --mode local plans a CPU run")


def check_gpus_at_build_time(ctx: DoctorContext) -> Check:
    return Check("gpus", SKIP, "not checked at build time (%test runs without --nv or --rocm); "
                               "run `ddp-launch doctor` on a GPU node")


# `ddp-launch doctor --image` runs these, in this order, as `ddp-launch doctor` runs checks.CHECKS.
IMAGE_CHECKS: Tuple[CheckFunction, ...] = (
    check_entry_points,
    check_torch,
    check_trainer_imports,
    check_site_profiles,
    check_fabric_defaults,
    check_accelerators,
    check_launch_plan,
    check_gpus_at_build_time,
)
