"""runai/ on RCP's twin: what runai/submit.sh asks RunAI for, run the way Kubernetes runs it, one
Charliecloud container per pod, with the pod's own site (rcp, runai/pod.sh's default).

The submission runs the real runai/submit.sh against the RunAI CLI v1's stand-in
(tests/bats/stubs/runai), which takes only the CLI's documented flags and refuses a workload name
in use, as Kubernetes does; a resubmission under the same RUNAI_JOB_NAME must still be taken.
The twin (tests/e2e/cluster/twins/rcp.sh, tests/e2e/twins.py): two hosts named as a PyTorchJob's
pods, the pod network on eth0 and the RoCE network's net1, the RDMA device mlx5_bond_0 with a real
port's RoCE v2 GID table in /sys/class/infiniband. The image is containers/Dockerfile built by
ch-image on the test base; the pod's environment is the image's ENV plus what the training operator
and RunAI set. The pods have no GPU (RUNAI_NUM_OF_GPUS=0): one CPU worker each, with gloo.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import twins
from conftest import CLUSTER_SH, REPO, container_versions

pytestmark = pytest.mark.e2e

TWIN = twins.RCP
DOCKERFILE = REPO / "containers" / "Dockerfile"
SUBMIT = REPO / "runai" / "submit.sh"
RUNAI_STAND_IN = REPO / "tests" / "bats" / "stubs" / "runai"


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


def submitted_runai_argv(work: Path, *trainer_args: str) -> list:
    """runai/submit.sh against the RunAI CLI v1's stand-in, whose workloads (names in use) are kept in
    work: the argv the stand-in took."""
    stub = work / "stub" / "runai"
    if not stub.exists():
        stub.parent.mkdir()
        stub.symlink_to(RUNAI_STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DDP_", "RUNAI_", "PET_"))}
    # The two volumes submit.sh requires: the pods below mount them at /mnt/data and /mnt/runs.
    env.update(PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}", RUNAI_IMAGE="registry.example/ddp:1",
               RUNAI_WORKERS="1", RUNAI_GPUS="0", RUNAI_DATA_PVC="cifar-data", RUNAI_RUN_PVC="ddp-runs",
               RUNAI_FAKE_CLI="v1", RUNAI_FAKE_STATE=str(work / "runai"))
    done = subprocess.run(["bash", str(SUBMIT), *trainer_args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return (work / "runai" / "argv").read_text().split("\0")[:-1]


def pod_env_settings(runai_argv: list) -> dict:
    """The variables `-e NAME=VALUE` puts in every pod (both CLIs' -e, --environment)."""
    flags = runai_argv[:runai_argv.index("--")]
    return dict(flags[i + 1].split("=", 1) for i, flag in enumerate(flags) if flag == "-e")


def image_env(root: Path) -> dict:
    lines = (root / "ch" / "environment").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def run_pods(twin_cluster, root: Path, argv: list, data: Path, runs: Path, run_dir: str) -> list[str]:
    """One pod per twin node, as the training operator starts a PyTorchJob's: the master's name in
    PET_MASTER_ADDR (its Service), RunAI's MASTER_ADDR the master pod's IP; their outputs."""
    master = twin_cluster.node_names[0]
    pods = []
    for rank, node in enumerate(twin_cluster.node_names):
        # A pod's environment is the image's ENV plus what the operator sets: nothing from the host.
        pod_env = {**image_env(root), "HOSTNAME": node, "HOME": "/root", "USER": "root", "PET_NNODES": "2",
                   "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "29533",
                   "MASTER_ADDR": twin_cluster.address(master), "MASTER_PORT": "29533", "RANK": str(rank),
                   "WORLD_SIZE": "2", "RUNAI_NUM_OF_GPUS": "0", "DDP_DATA_DIR": "/mnt/data", "DDP_RUN_DIR": run_dir}
        command = [str(CLUSTER_SH), "exec", node, "env", "-i", *[f"{k}={v}" for k, v in pod_env.items()],
                   "ch-run", "-b", f"{data}:/mnt/data", "-b", f"{runs}:/mnt/runs", str(root), "--", *argv]
        print("+ " + shlex.join(command), flush=True)
        pods.append(subprocess.Popen(command, env=twin_cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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
    assert [pod.returncode for pod in pods] == [0, 0], outputs
    return outputs


@pytest.fixture(scope="module")
def submissions(tmp_path_factory) -> list:
    """Two runai/submit.sh submissions in a row under the same RUNAI_JOB_NAME (the default), as a
    user resubmits: the argv the stand-in took for each."""
    work = tmp_path_factory.mktemp("rcp-submit")
    trainer_args = ("--epochs", "1", "--batch-size", "64", "--width-scale", "0.125", "--allow-unverified-data")
    return [submitted_runai_argv(work, *trainer_args) for _ in range(2)]


@pytest.fixture(scope="module")
def pods(twin, runai_image, cifar_data, tmp_path_factory, submissions):
    """The two pods of the first runai/submit.sh submission, run to their end."""
    from e2e_image import charliecloud_copy
    work = tmp_path_factory.mktemp("rcp-pods")
    argv = pod_argv(dockerfile_entrypoint(), submissions[0])
    root = charliecloud_copy(work / "runai.image", runai_image)
    runs = work / "runs"
    runs.mkdir()
    for mount_point in ("mnt/data", "mnt/runs"):  # Kubernetes creates a volume's mount point
        (root / mount_point).mkdir(parents=True, exist_ok=True)
    run_dir = pod_env_settings(submissions[0])["DDP_RUN_DIR"]
    assert run_dir.startswith("/mnt/runs/"), run_dir
    outputs = run_pods(twin, root, argv, cifar_data, runs, run_dir)
    return argv, outputs, runs / run_dir[len("/mnt/runs/"):]


def test_a_resubmission_under_the_same_name_is_a_workload_and_a_run_of_its_own(submissions):
    # The stand-in refuses a name in use ("the job ... already exists"): both were taken, each under
    # a name and into a run dir of its own, the prefix, the UTC time and 4 random characters.
    names = [argv[argv.index("--name") + 1] for argv in submissions]
    run_dirs = [pod_env_settings(argv)["DDP_RUN_DIR"] for argv in submissions]
    assert all(re.fullmatch(r"ddp-train-\d{8}-\d{6}-[a-z0-9]{4}", name) for name in names), names
    assert names[0] != names[1]
    assert run_dirs == [f"/mnt/runs/{name}" for name in names]


def test_two_runai_pods_rendezvous_at_the_masters_name_and_train(pods, images):
    argv, outputs, run_dir = pods
    assert argv[0] == "/opt/ddp/runai/pod.sh", argv
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = [r for r in records if r["type"] == "summary"][-1]
    assert summary["world_size"] == 2 and summary["nodes"] == 2
    run = [r for r in records if r["type"] == "run"][-1]
    # Built from the same base as the SIF: the same torch.
    assert run["versions"]["torch"] == container_versions(images.x86)["torch"]


def test_runai_pods_take_the_roce_device_and_its_ipv4_roce_v2_gid_from_sysfs(pods):
    # mlx5_bond_0's GID table (tests/fakes/node.py RCP_GIDS): index 3 is the IPv4-mapped
    # RoCE v2 entry, which EPFL RCP's multi-node guide has NCCL use.
    _, outputs, _ = pods
    environment = re.search(r"^.*rank0: Environment: (.*)$", outputs[0], re.M).group(1)
    assert "NCCL_IB_GID_INDEX=3" in environment and "NCCL_IB_HCA=mlx5_bond_0" in environment, environment
