"""The images built by the real `apptainer build` from containers/gpu.def, run by the real
Apptainer as the cluster's test user (the RunAI pods, on RCP's twin: test_twin_rcp.py).
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, user_dir
from fakes.elf_tree import build_fake_olivia_host, build_library  # a fake HPE Cray EX host tree

pytestmark = pytest.mark.e2e



def apptainer(cluster, args: list, cwd: Path, env: dict | None = None, timeout: float = 300):
    """The real apptainer, run by the test user in a login environment plus env."""
    return cluster.as_user(["apptainer", *args], env=env, cwd=user_dir(cwd), timeout=timeout)


# --- %test: `apptainer test` (Apptainer user guide, "Definition Files", %test) --------

def test_apptainer_test_passes_on_the_built_image(cluster, sif, tmp_path):
    done = apptainer(cluster, ["test", sif], tmp_path)

    assert done.returncode == 0, done.stderr
    assert "OK" in done.stdout and "trainer" in done.stdout


def test_apptainer_test_passes_inside_a_slurm_job_without_gpus(cluster, sif, tmp_path):
    # `make build-olivia-job`: %test runs inside a GPU build job, without --nv; the job's
    # GPU variables are in the environment, no driver library is in the image.
    done = cluster.as_user(["srun", "-N1", "--partition=e2e", "apptainer", "test", sif], cwd=user_dir(tmp_path),
                           env={"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, timeout=300)

    assert done.returncode == 0, done.stderr
    assert "trainer" in done.stdout


def test_apptainer_test_fails_on_an_image_missing_the_trainer(cluster, sif, tmp_path):
    # The image's trainer package (gpu.def %files: src/ddp_train) without train.py, bound over the
    # image's (`apptainer test` takes exec's --bind): what %test sees is an image built without the
    # trainer, and the SIF is not unpacked into a 2 GB sandbox for it.
    package = user_dir(tmp_path) / "ddp_train"
    shutil.copytree(REPO / "src" / "ddp_train", package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / "train.py").unlink()
    subprocess.run(["chmod", "-R", "o+rX", str(package)], check=True)

    done = apptainer(cluster, ["test", "--bind", f"{package}:/opt/ddp/python/ddp_train", sif], tmp_path)

    assert done.returncode != 0
    assert "ddp_train.train does not import" in done.stdout


# --- the fabric closure: real ELF files bound in, loaded by the doctor in the container ---

def _doctor_line(output: str, check: str) -> str:
    lines = [line for line in output.splitlines() if re.match(rf"^\w+\s+{re.escape(check)}:", line)]
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture
def olivia_host(tmp_path):
    host = build_fake_olivia_host(user_dir(tmp_path) / "host")
    subprocess.run(["chmod", "-R", "o+rX", str(host["root"])], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DDP_"))}
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "binds", "--site", "olivia", "--root",
                           str(host["root"])], env={**env, "PYTHONPATH": str(REPO / "entrypoints")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    print(done.stderr)
    return host, done.stdout.strip()


def test_host_libraries_and_their_dependencies_load_inside_the_container(cluster, sif, tmp_path, olivia_host):
    # The bind targets (/opt/host-libs/...) do not exist in the image: Apptainer creates
    # them ("Bind Paths and Mounts": the destination need not exist in the container).
    host, binds = olivia_host

    done = apptainer(cluster, ["exec", sif, "ddp-launch", "doctor", "--site", "olivia", "--offline"], tmp_path,
                     {"APPTAINER_BIND": binds})

    line = _doctor_line(done.stdout, "library dependencies")
    assert line.startswith("OK"), done.stdout
    bound = len([name for name in host["libraries"] if name != "fi_info"])
    assert f"{bound} bound libraries load" in line
    assert _doctor_line(done.stdout, "libfabric").startswith("OK")


def test_a_dependency_left_unbound_is_named_by_the_doctor_inside_the_container(cluster, sif, tmp_path, olivia_host):
    _, binds = olivia_host
    kept = ",".join(b for b in binds.split(",") if not b.endswith(":/opt/host-libs/libfakenl-3.so.200"))
    assert kept != binds

    done = apptainer(cluster, ["exec", sif, "ddp-launch", "doctor", "--site", "olivia", "--offline"], tmp_path,
                     dict(APPTAINER_BIND=kept, SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="2",
                          SLURM_NNODES="2", SLURM_JOB_NODELIST="node[1-2]", SLURM_STEP_ID="0",
                          SLURM_STEP_NODELIST="node[1-2]", SLURM_STEP_NUM_NODES="2",
                          SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)",
                          SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0"))

    line = _doctor_line(done.stdout, "library dependencies")
    assert line.startswith("FAIL"), done.stdout
    assert "libfakenl-3.so.200 is missing (needed to load " in line and "libcxi.so.1" in line
    assert done.returncode != 0


# --- granted GPUs, a node without them -------------------------------------------

GPU_JOB = dict(SLURM_JOB_ID="77", SLURM_STEP_ID="0", SLURM_JOB_NODELIST="node1", SLURM_STEP_NODELIST="node1",
               SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="1", SLURM_NODEID="0",
               SLURMD_NODENAME="node1", SLURM_GPUS_ON_NODE="4")


def _errors(done) -> list:
    return [line for line in done.stderr.splitlines() if not line.startswith(("INFO:", "WARNING:"))]


@pytest.mark.parametrize("nv", [[], ["--nv"]], ids=["without --nv", "with --nv"])
def test_granted_gpus_on_a_node_without_nvidia_devices_stop_in_one_line_saying_so(cluster, sif, tmp_path, nv):
    # The image's runscript and the real CUDA probe. --nv binds the host's NVIDIA libraries
    # (Apptainer user guide, "GPU Support"); this host has none, and the real Apptainer 1.4
    # leaves no trace of --nv inside, so "add --nv" would be advice to a user who may have.
    done = apptainer(cluster, ["run", *nv, sif, "--dry-run"], tmp_path, GPU_JOB)

    assert done.returncode == 2
    errors = _errors(done)
    assert len(errors) == 1 and errors[0].startswith("ddp-launch: error: SLURM_GPUS_ON_NODE=4 granted 4 GPU(s)")
    assert "no driver libraries for Apptainer's --nv to bind: not a GPU node?" in errors[0]
    assert "apptainer run --nv`" not in errors[0]

    done = apptainer(cluster, ["run", *nv, sif, "--dry-run", "--cpu-workers", "2"], tmp_path, GPU_JOB)
    assert done.returncode == 0 and "--nproc-per-node=2" in done.stdout


# --- the host closure does not shadow the image's own libraries ----------------------

ZSTD_PROBE = """\
import ctypes, json, os, sys
ctypes.CDLL("libzstd.so.1")
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libzstd" in line})
with open(sys.argv[1], "w") as out:
    json.dump(mapped, out)
"""


def test_a_worker_loads_the_images_libzstd_not_the_host_closures(cluster, sif, tmp_path):
    # ld.so(8): LD_LIBRARY_PATH is searched before ld.so.cache and the trusted directories, so
    # a host libzstd.so.1 bound into /opt/host-libs would replace the image's own for every
    # process unless the launcher puts the image's directories before the closure directory.
    work = user_dir(tmp_path)
    host = build_fake_olivia_host(work / "host")
    lib64 = host["root"] / "usr/lib64"
    zstd = build_library(lib64 / "libzstd.so.1", "libzstd.so.1", source="int host_zstd_marker(void) { return 1; }\n")
    build_library(host["root"] / "cluster/work/support/nccl/lib/libfakeextra.so.1", "libfakeextra.so.1", needs=[zstd])
    subprocess.run(["chmod", "-R", "o+rX", str(host["root"])], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DDP_"))}
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "binds", "--site", "olivia", "--root",
                           str(host["root"])], env={**env, "PYTHONPATH": str(REPO / "entrypoints")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    binds = done.stdout.strip()
    assert ":/opt/host-libs/libzstd.so.1" in binds  # the closure carries the host's copy
    (work / "zstd_probe.py").write_text(ZSTD_PROBE)
    (work / "zstd_probe.py").chmod(0o644)

    run = apptainer(cluster, ["exec", sif, "ddp-launch", "--site", "olivia", "--mode", "local", "--cpu-workers", "1",
                              "--script", "zstd_probe.py", "--", str(work / "zstd.json")],
                    work, {"APPTAINER_BIND": binds})

    assert run.returncode == 0, run.stderr
    mapped = json.loads((work / "zstd.json").read_text())
    assert mapped and all(path.startswith(("/usr/lib/", "/lib/")) for path in mapped), mapped
