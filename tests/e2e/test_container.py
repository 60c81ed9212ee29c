"""The image built from the real recipe, run in real containers (Charliecloud's ch-run).

Apptainer paths go through tests/e2e/bin/apptainer; the RunAI path runs the Dockerfile's
ENTRYPOINT rule the way Kubernetes does, one container per "pod" in each node's namespaces.
"""
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CLUSTER_SH, REPO, SHIM_BIN

sys.path.insert(0, str(REPO / "containers"))
sys.path.insert(0, str(REPO / "tests" / "unit" / "fabric"))
from deffile import sections  # noqa: E402
from elf_tree import build_fake_olivia_host, build_library  # noqa: E402  (helper-1's fake Cray EX host tree)

pytestmark = pytest.mark.e2e

APPTAINER = SHIM_BIN / "apptainer"
DEFINITION = REPO / "containers" / "gpu.def"
DOCKERFILE = REPO / "containers" / "Dockerfile"
SUBMIT = REPO / "runai" / "submit.sh"


def _host_env(**extra: str) -> dict:
    """This machine's environment without any SLURM job or site settings leaking in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "DDP_", "EBROOT", "APPTAINER", "CUDA_VISIBLE", "RUNAI_", "PET_"))}
    return {**env, **extra}


def apptainer(args: list, env: dict, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    print("+ apptainer " + shlex.join(str(a) for a in args), flush=True)
    done = subprocess.run([str(APPTAINER), *map(str, args)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    print(done.stdout + done.stderr + f"+ exit status: {done.returncode}", flush=True)
    return done


# --- %test ---------------------------------------------------------------------------

def _run_test_section(sif: Path, tmp_path: Path, **extra_env: str) -> subprocess.CompletedProcess:
    # Apptainer runs %test as /bin/sh in the built image, with the host environment and no --nv.
    body = sections(DEFINITION.read_text())["test"]
    return apptainer(["exec", sif, "/bin/sh", "-c", body], _host_env(**extra_env), tmp_path)


def test_the_test_section_passes_in_the_built_image(sif, tmp_path):
    done = _run_test_section(sif, tmp_path)

    assert done.returncode == 0, done.stderr


def test_the_test_section_passes_inside_a_slurm_build_job_without_gpus(sif, tmp_path):
    # `make build-olivia-job`: apptainer build runs %test inside a GPU job, without --nv.
    done = _run_test_section(sif, tmp_path, SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1",
                             SLURM_NODELIST="gpu-1-1", SLURM_JOB_NODELIST="gpu-1-1", SLURM_GPUS_ON_NODE="4",
                             SLURM_JOB_GPUS="0,1,2,3", CUDA_VISIBLE_DEVICES="0,1,2,3", SLURM_PROCID="0",
                             SLURM_NTASKS="1", SLURM_CPUS_ON_NODE="72")

    assert done.returncode == 0, done.stderr


def test_the_test_section_fails_on_an_image_missing_the_trainer(sif, tmp_path):
    root = Path(json.loads(sif.read_text())["charliecloud_root"])
    (root / "opt/ddp/python/ddp_train/train.py").unlink()  # this test's own hard-linked copy only

    done = _run_test_section(sif, tmp_path)

    assert done.returncode != 0


# --- the fabric closure: real ELF files bound in, loaded by the doctor in the container ---

def _doctor_line(output: str, check: str) -> str:
    lines = [line for line in output.splitlines() if re.match(rf"^\w+\s+{re.escape(check)}:", line)]
    assert len(lines) == 1, output
    return lines[0]


@pytest.fixture
def olivia_host(tmp_path):
    host = build_fake_olivia_host(tmp_path / "host")
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "binds", "--site", "olivia", "--root",
                           str(host["root"])], env=_host_env(PYTHONPATH=str(REPO / "entrypoints")),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    print(done.stderr)
    return host, done.stdout.strip()


def test_host_libraries_and_their_dependencies_load_inside_the_container(sif, tmp_path, olivia_host):
    host, binds = olivia_host

    done = apptainer(["exec", sif, "ddp-launch", "doctor", "--site", "olivia", "--offline"],
                     _host_env(APPTAINER_BIND=binds), tmp_path)

    line = _doctor_line(done.stdout, "library dependencies")
    assert line.startswith("OK"), done.stdout
    bound = len([name for name in host["libraries"] if name != "fi_info"])
    assert f"{bound} bound libraries load" in line
    assert _doctor_line(done.stdout, "libfabric").startswith("OK")


def test_a_dependency_left_unbound_is_named_by_the_doctor_inside_the_container(sif, tmp_path, olivia_host):
    _, binds = olivia_host
    kept = ",".join(b for b in binds.split(",") if not b.endswith(":/opt/host-libs/libfakenl-3.so.200"))
    assert kept != binds

    done = apptainer(["exec", sif, "ddp-launch", "doctor", "--site", "olivia", "--offline"],
                     _host_env(APPTAINER_BIND=kept, SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="2",
                               SLURM_NNODES="2", SLURM_JOB_NODELIST="node[1-2]", SLURM_STEP_ID="0",
                               SLURM_STEP_NODELIST="node[1-2]", SLURM_STEP_NUM_NODES="2",
                               SLURM_STEP_NUM_TASKS="2", SLURM_STEP_TASKS_PER_NODE="1(x2)",
                               SLURM_NODEID="0", SLURM_PROCID="0", SLURM_LOCALID="0"), tmp_path)

    line = _doctor_line(done.stdout, "library dependencies")
    assert line.startswith("FAIL"), done.stdout
    assert "libfakenl-3.so.200 is missing (needed to load " in line and "libcxi.so.1" in line
    assert done.returncode != 0


# --- granted GPUs without --nv -------------------------------------------------------

def test_a_gpu_job_run_without_nv_stops_in_one_line_naming_nv(sif, tmp_path):
    # The image's runscript and the real CUDA probe (no driver library in this container).
    job = dict(SLURM_JOB_ID="77", SLURM_STEP_ID="0", SLURM_JOB_NODELIST="node1", SLURM_STEP_NODELIST="node1",
               SLURM_STEP_NUM_NODES="1", SLURM_STEP_TASKS_PER_NODE="1", SLURM_NODEID="0",
               SLURMD_NODENAME="node1", SLURM_GPUS_ON_NODE="4")

    done = apptainer(["run", sif, "--dry-run"], _host_env(**job), tmp_path)

    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if not line.startswith("INFO:")]
    assert len(errors) == 1 and errors[0].startswith("ddp-launch: error: SLURM_GPUS_ON_NODE=4 granted 4 GPU(s)")
    assert "apptainer run --nv" in errors[0]

    done = apptainer(["run", sif, "--dry-run", "--cpu-workers", "2"], _host_env(**job), tmp_path)
    assert done.returncode == 0 and "--nproc-per-node=2" in done.stdout


# --- RunAI: the Docker recipe's ENTRYPOINT + what submit.sh passes, one container per pod ---

def dockerfile_entrypoint() -> list:
    lines = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    assert len(lines) == 1, lines
    return json.loads(lines[0][len("ENTRYPOINT "):])


def pod_argv(entrypoint: list, runai_argv: list) -> list:
    """Run:ai CLI reference (runai submit-dist pytorch): the words after `--` are arguments to
    the image's ENTRYPOINT, unless --command is given, when they replace it (Kubernetes'
    command/args, "Define a Command and Arguments for a Container")."""
    cut = runai_argv.index("--")
    return runai_argv[cut + 1:] if "--command" in runai_argv[:cut] else entrypoint + runai_argv[cut + 1:]


def submitted_runai_argv(tmp_path: Path, *trainer_args: str) -> list:
    record = tmp_path / "runai.argv"
    stub = tmp_path / "stub" / "runai"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" > "{record}"\n')
    stub.chmod(0o755)
    # The two volumes submit.sh requires: the pods below mount them at /mnt/data and /mnt/runs.
    env = _host_env(PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}", RUNAI_IMAGE="registry.example/ddp:1",
                    RUNAI_WORKERS="1", RUNAI_GPUS="0", RUNAI_DATA_PVC="cifar-data", RUNAI_RUN_PVC="ddp-runs")
    done = subprocess.run(["bash", str(SUBMIT), *trainer_args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return record.read_text().split("\0")[:-1]


def image_env(root: Path) -> dict:
    lines = (root / "ch" / "environment").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_two_runai_pods_rendezvous_across_two_nodes_and_train(cluster, sif, cifar_data, tmp_path):
    argv = pod_argv(dockerfile_entrypoint(),
                    submitted_runai_argv(tmp_path, "--epochs", "1", "--batch-size", "64", "--width-scale", "0.25",
                                         "--allow-unverified-data"))
    root = Path(json.loads(sif.read_text())["charliecloud_root"])
    runs = tmp_path / "runs"
    runs.mkdir()
    for mount_point in ("mnt/data", "mnt/runs"):  # Kubernetes creates a volume's mount point
        (root / mount_point).mkdir(parents=True, exist_ok=True)
    master = cluster.address("node1")  # RunAI gives MASTER_ADDR as the master pod's IP

    pods = []
    for rank, node in enumerate(cluster.node_names[:2]):  # two pods (PET_NNODES=2), whatever the cluster's size
        # A pod's environment is the image's ENV plus what the operator sets: nothing from the host.
        pod_env = {**image_env(root), "HOSTNAME": f"ddp-train-{'master' if rank == 0 else 'worker'}-0",
                   "HOME": "/root", "USER": "root", "PET_NNODES": "2", "PET_NODE_RANK": str(rank),
                   "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "29533", "MASTER_ADDR": master,
                   "MASTER_PORT": "29533", "RANK": str(rank), "WORLD_SIZE": "2", "RUNAI_NUM_OF_GPUS": "0",
                   "DDP_LAUNCH_CPU_WORKERS": "2", "DDP_SITE": "generic", "DDP_DATA_DIR": "/mnt/data",
                   "DDP_RUN_DIR": "/mnt/runs/ddp-train"}
        command = [str(CLUSTER_SH), "exec", node, "env", "-i", *[f"{k}={v}" for k, v in pod_env.items()],
                   "ch-run", "-b", f"{cifar_data}:/mnt/data", "-b", f"{runs}:/mnt/runs", str(root), "--", *argv]
        print("+ " + shlex.join(command), flush=True)
        pods.append(subprocess.Popen(command, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True))
    outputs = []
    deadline = time.monotonic() + 300
    for pod in pods:
        try:
            outputs.append(pod.communicate(timeout=max(1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for other in pods:
                other.kill()
            pytest.fail("the RunAI pods did not finish in 300 s")
    for text in outputs:
        print(text)

    assert argv[0] == "/opt/ddp/runai/pod.sh", argv
    assert [pod.returncode for pod in pods] == [0, 0], outputs
    records = [json.loads(line) for line in (runs / "ddp-train" / "metrics.jsonl").read_text().splitlines()]
    summary = [r for r in records if r["type"] == "summary"][-1]
    assert summary["world_size"] == 4 and summary["nodes"] == 2
    run = [r for r in records if r["type"] == "run"][-1]
    assert run["versions"]["torch"] == container_torch(sif, tmp_path)


def container_torch(sif: Path, cwd: Path) -> str:
    done = apptainer(["exec", sif, "python3", "-c", "import torch; print(torch.__version__)"], _host_env(), cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- the host closure does not shadow the image's own libraries ----------------------

ZSTD_PROBE = """\
import ctypes, json, os, sys
ctypes.CDLL("libzstd.so.1")
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libzstd" in line})
with open(sys.argv[1], "w") as out:
    json.dump(mapped, out)
"""


def test_a_worker_loads_the_images_libzstd_not_the_host_closures(sif, tmp_path):
    # ld.so(8): LD_LIBRARY_PATH is searched before ld.so.cache and the trusted directories, so
    # a host libzstd.so.1 bound into /opt/host-libs would replace the image's own for every
    # process unless the launcher puts the image's directories before the closure directory.
    host = build_fake_olivia_host(tmp_path / "host")
    lib64 = host["root"] / "usr/lib64"
    zstd = build_library(lib64 / "libzstd.so.1", "libzstd.so.1", source="int host_zstd_marker(void) { return 1; }\n")
    build_library(host["root"] / "cluster/work/support/nccl/lib/libfakeextra.so.1", "libfakeextra.so.1", needs=[zstd])
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "binds", "--site", "olivia", "--root",
                           str(host["root"])], env=_host_env(PYTHONPATH=str(REPO / "entrypoints")),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    binds = done.stdout.strip()
    assert ":/opt/host-libs/libzstd.so.1" in binds  # the closure carries the host's copy
    (tmp_path / "zstd_probe.py").write_text(ZSTD_PROBE)

    run = apptainer(["exec", sif, "ddp-launch", "--site", "olivia", "--mode", "local", "--cpu-workers", "1",
                     "--script", "zstd_probe.py", "--", str(tmp_path / "zstd.json")],
                    _host_env(APPTAINER_BIND=binds), tmp_path)

    assert run.returncode == 0, run.stderr
    mapped = json.loads((tmp_path / "zstd.json").read_text())
    assert mapped and all(path.startswith(("/usr/lib/", "/lib/")) for path in mapped), mapped
