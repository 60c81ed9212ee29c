"""`ddp-launch doctor --image`: the build-time checks pass on any builder and fail a broken image."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from ddp_launch import doctor
from ddp_launch.doctor.self_test import (check_entry_points, check_launch_plan, check_site_profiles,
                                          check_trainer_imports, self_test_env)

VENV_BIN = str(Path(sys.executable).parent)  # where ddp-launch and ddp-train are installed


def on(env):
    """What these checks read of the doctor's context: the environment alone."""
    return SimpleNamespace(env=env)

BUILD_JOB = {"SLURM_JOB_ID": "9", "SLURM_GPUS_ON_NODE": "4", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_JOB_NODELIST": "gh[001-002]", "PET_NNODES": "2", "DDP_LAUNCH_MODE": "slurm-node"}


def test_a_build_job_with_gpus_granted_and_none_visible_passes():
    out = io.StringIO()

    code = doctor.run(["--image", "--json"], {**BUILD_JOB, "PATH": f"{VENV_BIN}:/usr/bin:/bin"}, out)

    report = json.loads(out.getvalue())
    assert code == 0, report
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses["gpus"] == "SKIP" and statuses["trainer"] == "OK" and statuses["launch plan"] == "OK"
    assert statuses["fabric defaults"] == "OK" and statuses["accelerators"] == "OK"
    # One line per check of IMAGE_CHECKS, in its order: what the image carries first, the plan, then the GPUs.
    assert [c["name"] for c in report["checks"]] == ["entry points", "torch", "trainer", "site profiles",
                                                     "fabric defaults", "accelerators", "launch plan", "gpus"]


def test_missing_entry_points_fail():
    check = check_entry_points(on({"PATH": VENV_BIN}), which=lambda name, path: None if name == "ddp-train" else "/x")
    assert check.status == "FAIL" and "ddp-train not on PATH" in check.detail


def test_a_trainer_that_does_not_import_fails():
    def broken(name):
        raise ModuleNotFoundError("No module named 'torch'")

    check = check_trainer_imports(on({}), broken)
    assert check.status == "FAIL" and "No module named 'torch'" in check.detail


def test_a_broken_site_profile_fails_naming_the_file(tmp_path):
    (tmp_path / "olivia.json").write_text('{"schema": 1, "name": "olivia"')
    check = check_site_profiles(on({"DDP_SITES_DIR": str(tmp_path)}))
    assert check.status == "FAIL" and "olivia.json" in check.detail


def test_fabric_defaults_left_out_of_the_image_fail(tmp_path, monkeypatch):
    from ddp_launch.doctor.self_test import check_fabric_defaults
    from ddp_launch.fabric import defaults

    assert check_fabric_defaults(on({})).status == "OK"
    monkeypatch.setattr(defaults, "fabric_dirs", lambda env: (str(tmp_path / "fabrics"),))
    check = check_fabric_defaults(on({}))
    assert check.status == "FAIL" and "fabrics/slingshot.json not found" in check.detail
    assert "/opt/ddp/sites" in check.fix


def test_accelerator_data_left_out_of_the_image_fails(tmp_path, monkeypatch):
    from ddp_launch import accelerators
    from ddp_launch.doctor.self_test import check_accelerators

    assert check_accelerators(on({})).status == "OK"
    monkeypatch.setattr(accelerators, "accelerator_dirs", lambda env: (str(tmp_path / "accelerators"),))
    check = check_accelerators(on({}))
    assert check.status == "FAIL" and "accelerators/nvidia.json not found" in check.detail
    assert "/opt/ddp/sites" in check.fix


def test_the_self_test_plan_ignores_the_build_jobs_scheduler():
    assert self_test_env({**BUILD_JOB, "HOME": "/root"}) == {"HOME": "/root"}
    assert check_launch_plan(on({**BUILD_JOB, "PATH": "/usr/bin:/bin"})).status == "OK"


def test_a_launcher_that_cannot_plan_fails(tmp_path):
    check = check_launch_plan(on({"PYTHONPATH": str(tmp_path), "PYTHONNOUSERSITE": "1", "PYTHONSAFEPATH": "1",
                                  "PYTHONHOME": str(tmp_path)}))
    assert check.status == "FAIL"


# -- the doctor runs where the workers would: with the launch plan's LD_LIBRARY_PATH --------

from ddp_launch.doctor import REAL_PROBES, library_path_for_workers, make_context  # noqa: E402
from ddp_launch.sites import load_site  # noqa: E402


def _olivia_context(tmp_path, env):
    for directory in ("opt/host-libs", "opt/libfabric/lib64", "opt/nccl/lib"):
        (tmp_path / directory).mkdir(parents=True)
    return make_context(env, str(tmp_path), True, load_site("olivia", env), "data", REAL_PROBES)


def test_the_fabric_directories_come_first_and_the_host_closure_last(tmp_path):
    # ld.so reads LD_LIBRARY_PATH at process start only (ld.so(8)): a libfabric that
    # needs the bound libcxi cannot load in a doctor started without the planned path.
    context = _olivia_context(tmp_path, {"LD_LIBRARY_PATH": "/.singularity.d/libs"})

    assert library_path_for_workers(context) == \
        "/opt/libfabric/lib64:/opt/nccl/lib:/.singularity.d/libs:/opt/host-libs"


def test_no_relaunch_once_the_process_has_the_planned_path(tmp_path):
    planned = "/opt/libfabric/lib64:/opt/nccl/lib:/.singularity.d/libs:/opt/host-libs"
    assert library_path_for_workers(_olivia_context(tmp_path, {"LD_LIBRARY_PATH": planned})) is None
