"""runai/ on RCP's twin: the README's RCP block, build to resume, run as written, with the pods RunAI
would start run the way Kubernetes runs them, one Charliecloud container per pod, with the pod's own
site (rcp, runai/pod.sh's default), as the user the block names (RUNAI_RUN_AS: --run-as-uid and
--run-as-gid, a pod's securityContext), on a claim whose homes/<user>/ is that user's.
The block runs whole in bash, with the RunAI CLI v1's stand-in (tests/bats/stubs/runai), which takes
only the CLI's documented flags and refuses a workload name in use, as Kubernetes does, and docker's
(tests/stand_ins/docker.sh); the image it builds and pushes is containers/Dockerfile, which ch-image
builds here on the test base. Then each submission's pods run, in the order a user waits for them:
the staging pod (CIFAR-100 onto the claim: runai/submit.sh --download, from a mirror on a file:// URL,
the pods having no internet here), the training's two pods (--epochs 50), and the resume's two pods
(RUNAI_RESUME, --epochs 80), each with the twin's short-training flags after the block's (one step
of 32 images an epoch), as the SLURM twins add theirs.

The twin (tests/e2e/cluster/twins/rcp.sh, tests/e2e/twins.py): two hosts named as a PyTorchJob's
pods, the pod network on eth0 and the RoCE network's net1, the RDMA device mlx5_bond_0 with a real
port's RoCE v2 GID table in /sys/class/infiniband. The pod's environment is the image's ENV plus what
the training operator and RunAI set. The pods have no GPU (RUNAI_NUM_OF_GPUS=0): one CPU worker each,
with gloo.

The training's pods run pod.sh's checks, `ddp-launch preflight` (doctor in each pod, one verdict, the
fabric gate across them) and the training, into a run dir where an earlier container of the master
pod left its lock (PID 1, a container restarted in its pod). The other situations are pods that stop
before training: a bad pod named by the preflight, each PET_NPROC_PER_NODE value, a claim the pod's
user cannot write.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import documented_blocks
import pytest
import twins
from apptainer_root import TEST_UID
from conftest import CLUSTER_SH, REPO, _reachable, container_versions, user_dir

pytestmark = pytest.mark.e2e

TWIN = twins.RCP
DOCKERFILE = REPO / "containers" / "Dockerfile"
SUBMIT = REPO / "runai" / "submit.sh"
RUNAI_STAND_IN = REPO / "tests" / "bats" / "stubs" / "runai"
DOCKER_STAND_IN = REPO / "tests" / "stand_ins" / "docker.sh"


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


def submitted_runai_argv(work: Path, *workload_args: str) -> list:
    """runai/submit.sh against the RunAI CLI v1's stand-in, whose workloads (names in use) are kept in
    work, with pods of the image's own user (RUNAI_RUN_AS=image; the README's block runs as the user,
    the `submitted` fixture): the argv the stand-in took."""
    stub = work / "stub" / "runai"
    if not stub.exists():
        stub.parent.mkdir()
        stub.symlink_to(RUNAI_STAND_IN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DDP_", "RUNAI_", "PET_"))}
    # The two volumes submit.sh requires: the pods below mount them at /mnt/data and /mnt/runs.
    env.update(PATH=f"{stub.parent}{os.pathsep}{os.environ['PATH']}", RUNAI_IMAGE="registry.example/ddp:1",
               RUNAI_WORKERS="1", RUNAI_GPUS="0", RUNAI_DATA_PVC="cifar-data", RUNAI_RUN_PVC="ddp-runs",
               RUNAI_RUN_AS="image", RUNAI_FAKE_CLI="v1", RUNAI_FAKE_STATE=str(work / "runai"))
    done = subprocess.run(["bash", str(SUBMIT), *workload_args], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return (work / "runai" / "argv").read_text().split("\0")[:-1]


def pod_env_settings(runai_argv: list) -> dict:
    """The variables `-e NAME=VALUE` puts in every pod (both CLIs' -e, --environment)."""
    flags = runai_argv[:runai_argv.index("--")]
    return dict(flags[i + 1].split("=", 1) for i, flag in enumerate(flags) if flag == "-e")


def image_env(root: Path) -> dict:
    lines = (root / "ch" / "environment").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


# The workload as Run:ai names it in its pods (NVIDIA Run:ai docs, "Workloads", Built-in Workload
# Environment Variables: RUNAI_JOB_UUID differs for every workload), and the job identity ddp-launch
# derives from it (schedulers/kubeflow.py).
def workload_uuid(workload: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{workload}.runai.e2e"))


def job_id(workload: str) -> str:
    return f"{workload}/{workload_uuid(workload)}"


def pod_env(twin_cluster, root: Path, rank: int, run_dir: str, workload: str = "ddp-train") -> dict:
    """A pod's environment: the image's ENV plus what Kubernetes, the training operator and RunAI set
    (the master's name in PET_MASTER_ADDR, its Service; RunAI's MASTER_ADDR the master pod's IP);
    nothing from the host."""
    master = twin_cluster.node_names[0]
    return {**image_env(root), "HOSTNAME": twin_cluster.node_names[rank], "HOME": "/root", "USER": "root",
            # Kubernetes sets these in every container ("Accessing the Kubernetes API from a Pod").
            "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
            "RUNAI_JOB_NAME": workload, "RUNAI_JOB_UUID": workload_uuid(workload), "RUNAI_PROJECT": "e2e",
            "PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "29533",
            "MASTER_ADDR": twin_cluster.address(master), "MASTER_PORT": "29533", "RANK": str(rank),
            "WORLD_SIZE": "2", "RUNAI_NUM_OF_GPUS": "0", "DDP_DATA_DIR": "/mnt/data", "DDP_RUN_DIR": run_dir,
            # A pod on RCP has CPUs of its own (its cgroup's); the twin's two share this machine's two
            # cores with everything else, where torch's default of a thread per core spins (twins.THREADS:
            # a step of the tiny model took 2.9 s in a pod without it, 0.18 s under torchrun beside it).
            "OMP_NUM_THREADS": twins.THREADS}


def pod_command(twin_cluster, node: str, root: Path, env: dict, binds: dict, argv: list,
                user: tuple | None = None) -> list:
    """ch-run in node's namespaces, as root or as user, (uid, gid): a pod's securityContext runAsUser
    and runAsGroup (RunAI's --run-as-uid and --run-as-gid)."""
    as_user = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups"] if user else []
    mounts = [word for source, target in binds.items() for word in ("-b", f"{source}:{target}")]
    return [str(CLUSTER_SH), "exec", node, "env", "-i", *[f"{k}={v}" for k, v in env.items()],
            *as_user, "ch-run", *mounts, str(root), "--", *argv]


def wait_for(path: Path, what: str, timeout_s: float = 240) -> Callable[[], None]:
    """A wait until path exists (a pod's container starts after it: a pod restarted more slowly)."""
    def wait():
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} ({path}) did not come in {timeout_s:.0f} s")
            time.sleep(0.5)
    return wait


def run_pods(twin_cluster, root: Path, argv: list, binds: dict, run_dir: str, changes: tuple = ({}, {}),
             expect: tuple = (0, 0), user: tuple | None = None, start_after: tuple = (None, None),
             envs: tuple | None = None, meanwhile: Callable[[], None] | None = None,
             timeout_s: float = 300) -> list[str]:
    """One pod per twin node, as the training operator starts a PyTorchJob's, each with its
    environment's changes (or its whole environment, envs) and, where start_after gives one, started
    once that wait returns; meanwhile, what the test does while they run; their outputs, once each
    exited as expected."""
    pods = []
    for rank, node in enumerate(twin_cluster.node_names):
        env = envs[rank] if envs else {**pod_env(twin_cluster, root, rank, run_dir), **changes[rank]}
        command = pod_command(twin_cluster, node, root, env, binds, argv, user)
        if start_after[rank] is not None:
            try:
                start_after[rank]()
            except TimeoutError as late:
                for pod in pods:
                    pod.kill()
                pytest.fail(f"{late}; the pods so far said: {[pod.communicate()[0] for pod in pods]}")
        print("+ " + shlex.join(command), flush=True)
        pods.append(subprocess.Popen(command, env=twin_cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True))
    deadline = time.monotonic() + timeout_s
    if meanwhile is not None:
        try:
            meanwhile()
        except TimeoutError as late:
            for pod in pods:
                pod.kill()
            pytest.fail(f"{late}; the pods said: {[pod.communicate()[0] for pod in pods]}")
    outputs = []
    for pod in pods:
        try:
            outputs.append(pod.communicate(timeout=max(1, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for other in pods:
                other.kill()
            pytest.fail(f"the RunAI pods did not finish in {timeout_s:.0f} s")
    for text in outputs:
        print(text)
    assert tuple(pod.returncode for pod in pods) == expect, outputs
    return outputs


def run_one(twin_cluster, root: Path, env: dict, binds: dict, argv: list, user: tuple | None = None, rank: int = 0):
    """One container in a pod's node (the master's unless rank says), to its end (a dry run, a pod that stops
    early)."""
    command = pod_command(twin_cluster, twin_cluster.node_names[rank], root, env, binds, argv, user)
    print("+ " + shlex.join(command), flush=True)
    done = subprocess.run(command, env=twin_cluster.env, capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    return done


# The README's placeholders, filled as the text above the block says: the user's RunAI project, name and
# tag, their uid and gid on the cluster (the test user's: the claim's homes/alice/ is theirs).
PLACEHOLDERS = {"<project>": "mlo", "<user>": "alice", "<tag>": "v1", "<uid>": str(TEST_UID), "<gid>": str(TEST_UID)}
# The claim's mount point in the pods, as the block mounts it (RUNAI_DATA_DIR, RUNAI_RUN_DIR).
CLAIM = "/mloscratch"
# The twin's flags after the block's, as the SLURM twins add TWIN_TRAIN_ARGS: one step of 32 images an
# epoch (16 per pod) and 32 to evaluate, the demo's 1/16-width model, the generated data. --epochs stays
# the block's: 50, then 80.
TWIN_TRAIN_ARGS = ("--limit-train", "32", "--limit-test", "32", "--batch-size", "32", "--width-scale", "0.0625",
                   "--allow-unverified-data")


def readme_rcp_block() -> str:
    """The README's RunAI block, build to resume (tests/unit/containers/test_runai_readme.py runs it too)."""
    found = [block.text for block in documented_blocks.blocks(documented_blocks.README)
             if "docker build" in block.text and "runai/submit.sh" in block.text]
    assert len(found) == 1, found
    return found[0]


@dataclass(frozen=True)
class Submitted:
    """What the README's RCP block submitted: the workloads the RunAI stand-in took, in order (the
    staging pod's, the training's, the resume's), and the argv each was given."""
    output: str
    workloads: tuple
    argv: dict

    def settings(self, workload: str) -> dict:
        return pod_env_settings(self.argv[workload])

    def user(self, workload: str) -> tuple:
        argv = self.argv[workload]
        return int(argv[argv.index("--run-as-uid") + 1]), int(argv[argv.index("--run-as-gid") + 1])


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, cifar_data) -> tuple:
    """The pods' CIFAR-100 source: the generated data as the published archive is laid out, in a
    directory the staging pod mounts, and its MD5 (ddp_contract.download's mirror variables)."""
    folder = tmp_path_factory.mktemp("rcp-mirror")
    archive = folder / "cifar-100-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(cifar_data / "cifar-100-python", arcname="cifar-100-python")
    subprocess.run(["chmod", "-R", "o+rX", str(folder)], check=True)
    _reachable(folder)
    return folder, hashlib.md5(archive.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def submitted(tmp_path_factory, mirror) -> Submitted:
    """The README's RCP block run whole, as a user runs it from the repository root, with the stand-ins
    of docker and the RunAI CLI v1 on PATH; RUNAI_EXTRA_ARGS names the mirror (this machine's pods have
    no internet)."""
    work = tmp_path_factory.mktemp("rcp-submit")
    (work / "bin").mkdir()
    (work / "bin" / "runai").symlink_to(RUNAI_STAND_IN)
    (work / "bin" / "docker").symlink_to(DOCKER_STAND_IN)
    state = work / "runai"
    script = readme_rcp_block()
    for placeholder, value in PLACEHOLDERS.items():
        script = script.replace(placeholder, value)
    script = script.replace("<run>", f'"$(sed -n 2p {state}/workloads)"')  # the training's, as it printed
    _, md5 = mirror
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DDP_", "RUNAI_", "PET_"))}
    env.update(PATH=f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}", RUNAI_FAKE_CLI="v1", RUNAI_FAKE_STATE=str(state),
               DOCKER_CALLS=str(work / "docker.calls"),
               RUNAI_EXTRA_ARGS=f"-e DDP_CIFAR_URL=file:///mirror/cifar-100-python.tar.gz -e DDP_CIFAR_MD5={md5}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stderr
    workloads = tuple((state / "workloads").read_text().split())
    return Submitted(done.stdout + done.stderr, workloads,
                     {name: (state / f"argv-{name}").read_text().split("\0")[:-1] for name in workloads})


@pytest.fixture(scope="module")
def claim(tmp_path_factory) -> Path:
    """RCP's scratch claim: homes/alice/ is the user's (their uid, mode 0755), as on /mloscratch."""
    root = tmp_path_factory.mktemp("rcp-claim")
    _reachable(root)
    user_dir(root / "homes" / "alice")
    return root


@pytest.fixture(scope="module")
def rcp_root(tmp_path_factory, runai_image) -> Path:
    """The image's copy the block's pods run, with the claim's mount point (Kubernetes creates it)."""
    from e2e_image import charliecloud_copy
    root = charliecloud_copy(tmp_path_factory.mktemp("rcp-pods") / "runai.image", runai_image)
    for mount_point in (CLAIM, "/mirror"):
        (root / mount_point.lstrip("/")).mkdir(parents=True, exist_ok=True)
    _reachable(root / "ch")
    return root


def block_pod_env(twin_cluster, root: Path, rank: int, submitted: Submitted, workload: str) -> dict:
    """A pod of one of the block's workloads: what RunAI sets, the submission's -e settings, and the
    user's (RunAI's --run-as-uid gives no home: HOME is the image's default)."""
    settings = submitted.settings(workload)
    env = {k: v for k, v in pod_env(twin_cluster, root, rank, settings.get("DDP_RUN_DIR", ""), workload).items()
           if not k.startswith("DDP_")}  # only what the submission set
    return {**env, **settings, "USER": "alice", "HOME": "/tmp"}


@pytest.fixture(scope="module")
def staged(twin, rcp_root, submitted, claim, mirror) -> str:
    """The staging workload's one pod (runai/submit.sh --download), run to its end as the user: its output."""
    staging = submitted.workloads[0]
    env = {k: v for k, v in block_pod_env(twin, rcp_root, 0, submitted, staging).items()
           if not k.startswith(("PET_", "MASTER_", "RANK", "WORLD_SIZE"))}  # a standard workload: one pod
    argv = pod_argv(dockerfile_entrypoint(), submitted.argv[staging])
    done = run_one(twin, rcp_root, env, {claim: CLAIM, mirror[0]: "/mirror"}, argv, submitted.user(staging))
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def run_block_pods(twin_cluster, root: Path, submitted: Submitted, claim: Path, workload: str,
                   start_after: tuple = (None, None)) -> list[str]:
    settings = submitted.settings(workload)
    named = {"RUNAI_JOB_NAME": workload}
    changes = tuple({**block_pod_env(twin_cluster, root, rank, submitted, workload), **named} for rank in (0, 1))
    argv = [*pod_argv(dockerfile_entrypoint(), submitted.argv[workload]), *TWIN_TRAIN_ARGS]
    return run_pods(twin_cluster, root, argv, {claim: CLAIM}, settings["DDP_RUN_DIR"], changes=changes,
                    user=submitted.user(workload), start_after=start_after)


@pytest.fixture(scope="module")
def pods(twin, rcp_root, submitted, claim, staged):
    """The training's two pods (the block's --epochs 50), run to their end, as RunAI names them:
    RUNAI_JOB_NAME is the workload's name, which is the new run's."""
    workload = submitted.workloads[1]
    argv = pod_argv(dockerfile_entrypoint(), submitted.argv[workload])
    run_dir = submitted.settings(workload)["DDP_RUN_DIR"]
    assert run_dir == f"{CLAIM}/homes/alice/runs/{workload}", run_dir
    # What the master pod's earlier container left: it was restarted in its pod (the kubelet restarts a
    # container after it exits), which keeps the pod's name and starts PID 1 again (alive here).
    here = user_dir(user_dir(claim / "homes" / "alice" / "runs") / workload)
    (here / ".ddp-run.lock").write_text(json.dumps(
        {"job": job_id(workload), "host": twin.node_names[0], "pid": 1, "pid_space": "an-earlier-container/1",
         "since": 0}))
    # What the worker pod's container of an hour ago left on the claim: its failing doctor report. This
    # attempt's worker container starts late, after the master's doctor wrote its report (a container
    # restarted more slowly than the other); the master must wait for the worker's new report, not judge it
    # by the old one.
    reports = user_dir(user_dir(here / "preflight") / job_id(workload).replace("/", "_"))
    stale = reports / f"doctor-{twin.node_names[1]}.json"
    stale.write_text(json.dumps({"ok": False, "checks": [{"name": "gpus", "status": "FAIL", "fix": "replace it",
                                                          "detail": "0 GPUs visible but 1 granted"}]}))
    os.chown(stale, TEST_UID, TEST_UID)
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    master_report = wait_for(reports / f"doctor-{twin.node_names[0]}.json", "the master pod's doctor report")
    outputs = run_block_pods(twin, rcp_root, submitted, claim, workload, start_after=(None, master_report))
    return argv, outputs, here


@pytest.fixture(scope="module")
def resumed(twin, rcp_root, submitted, claim, pods) -> list[str]:
    """The resume's two pods (RUNAI_RESUME=<run>, the block's --epochs 80), in a workload of their own:
    their outputs."""
    return run_block_pods(twin, rcp_root, submitted, claim, submitted.workloads[2])


def test_the_blocks_submissions_are_workloads_of_their_own_and_the_resume_continues_the_run(submitted):
    # The stand-in refuses a name in use ("the job ... already exists"): the three, under one prefix and
    # maybe in one second, were each taken under a name of its own: the prefix, the UTC time, 4 characters.
    staging, run, resume = submitted.workloads
    assert all(re.fullmatch(r"ddp-train-\d{8}-\d{6}-[a-z0-9]{4}", name) for name in submitted.workloads)
    assert len({staging, run, resume}) == 3
    assert submitted.settings(run)["DDP_RUN_DIR"] == submitted.settings(resume)["DDP_RUN_DIR"] == \
        f"{CLAIM}/homes/alice/runs/{run}"
    assert submitted.argv[resume][-3:] == ["--resume", "--epochs", "80"]
    assert all(submitted.user(name) == (TEST_UID, TEST_UID) for name in submitted.workloads)


def test_the_staging_pod_puts_cifar_100_on_the_claim_as_the_user(staged, claim):
    data = claim / "homes" / "alice" / "data" / "cifar-100-python"
    assert "CIFAR-100 ready in /mloscratch/homes/alice/data/cifar-100-python" in staged, staged
    assert sorted(p.name for p in data.iterdir()) == ["meta", "test", "train"]
    assert data.stat().st_uid == TEST_UID  # written by the pod's user, in the user's home


def test_the_resume_trains_the_run_on_to_the_longer_epochs(pods, resumed):
    _, _, run_dir = pods
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["type"] == "epoch"]
    # 50 epochs, then 30 more: each once, each its one step of 32 images.
    assert [r["epoch"] for r in epochs] == list(range(1, 81))
    assert {r["images"] for r in epochs} == {32}
    assert [s["epochs_run"] for s in records if s["type"] == "summary"] == [50, 80]
    extended = [r for r in records if r["type"] == "extended"]
    assert len(extended) == 1
    record = extended[0]
    assert (record["epochs_from"], record["epochs_to"], record["at_epoch"], record["at_step"]) == (50, 80, 50, 0)
    # The 50-epoch cosine had decayed to 0; the 80-epoch one goes on from its step 50, and decays to 0 again.
    assert record["lr_before"] == pytest.approx(0.0, abs=1e-12) and record["lr_after"] > 0
    lrs = [r["lr"] for r in epochs[50:]]
    assert lrs == sorted(lrs, reverse=True) and lrs[-1] < lrs[0] / 10
    assert f"Resumed from {CLAIM}/homes/alice/runs/{run_dir.name}/checkpoint.pt at epoch 51, step 0" in resumed[0]
    assert "Extended: --epochs 50 -> 80, on from epoch 51 step 0" in resumed[0], resumed[0]
    # The run's files are the user's: the pods ran as RUNAI_RUN_AS.
    owners = {name: (run_dir / name).stat().st_uid for name in ("checkpoint.pt", "checkpoint.json", "metrics.jsonl", "logs")}
    assert set(owners.values()) == {TEST_UID}, owners


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


def test_each_pod_checked_itself_and_the_fabric_before_training(pods):
    # ddp-launch preflight: doctor in both pods, one verdict from both reports on the claim, then the
    # fabric gate across the pods on a port of its own (the training's + 1).
    _, outputs, run_dir = pods
    for text in outputs:
        assert "preflight: ddp-launch doctor passed in every pod (2)" in text, text
        assert "preflight: the fabric gate passed" in text, text
    reports = sorted(p.name for p in (run_dir / "preflight" / job_id(run_dir.name).replace("/", "_")).iterdir())
    assert reports == ["doctor-ddp-train-master-0.json", "doctor-ddp-train-worker-0.json"]
    assert json.loads((run_dir / "gate.json").read_text())["ok"]
    # The master pod announces each rendezvous: the gate's, then the training's at MASTER_PORT.
    ports = re.findall(r"^ddp-launch: 2 pods: .*, port (\d+)$", outputs[0], re.M)
    assert ports == ["29534", "29533"], outputs[0]


def test_an_hour_old_failing_report_of_the_late_worker_pod_was_not_judged(pods):
    # The master's report came first, beside the worker's of an hour ago (a failing one): the master waited
    # for the worker's report of this attempt, which passed, instead of naming the worker bad (exit 76).
    _, outputs, run_dir = pods
    assert not any("bad pod" in text for text in outputs), outputs
    worker = run_dir / "preflight" / job_id(run_dir.name).replace("/", "_") / "doctor-ddp-train-worker-0.json"
    assert json.loads(worker.read_text())["ok"] and time.time() - worker.stat().st_mtime < 600


def test_the_worker_pods_log_says_what_it_joins_and_no_torchrun_warning(pods):
    # torchrun's "node_rank is only used for static rdzv_backend" came from PET_NODE_RANK, once per launch
    # (the gate's, the training's); then nothing, though the pod trained. Now one line per launch says what
    # the pod joins and where the progress shows.
    _, outputs, _ = pods
    worker = outputs[1]
    assert "node_rank is only used" not in worker, worker
    joins = re.findall(r"^ddp-launch: pod 1 of 2 joins the rendezvous \(rendezvous host ddp-train-master-0 "
                       r"\(PET_MASTER_ADDR\) = [0-9.]+, port (\d+)\) with 1 worker\(s\); the progress is printed "
                       r"by rank 0 alone", worker, re.M)
    assert joins == ["29534", "29533"], worker


def test_a_restarted_containers_own_lock_did_not_stop_its_pod(pods):
    # The lock named this workload (RUNAI_JOB_UUID), the master pod's name and PID 1: a restart of
    # this job, taken over; the trainer released its own at the end.
    _, outputs, run_dir = pods
    assert not any("is in use by" in text for text in outputs)
    assert not (run_dir / ".ddp-run.lock").exists()


def test_two_pods_sharing_the_rdma_device_each_take_their_own_gid(twin, pod_root):
    # The GID table both pods see lists each pod's entries, both named net1 (gid_attrs/ndevs): the
    # master's net1 is 172.18.128.3 (GID 3), the worker's .4 (GID 8). The lowest index, GID 3, in both
    # pods would make the worker's RoCE use the master's address. The image's torch has no NCCL, so
    # the index is set, with the reason (an image with NCCL 2.26.2 or later leaves it to NCCL).
    chosen = []
    for rank in (0, 1):
        env = pod_env(twin, pod_root, rank, "/mnt/runs/gid")
        done = run_one(twin, pod_root, env, {}, ["ddp-launch", "--dry-run", "--json", "--site", "rcp"], rank=rank)
        assert done.returncode == 0, done.stderr
        planned = {item["name"]: item for item in json.loads(done.stdout)["env"]}
        chosen.append(planned["NCCL_IB_GID_INDEX"]["value"])
        assert "no libnccl.so.2 where the workers look" in planned["NCCL_IB_GID_INDEX"]["reason"]
    assert chosen == ["3", "8"]


@pytest.fixture(scope="module")
def pod_root(tmp_path_factory, runai_image):
    """A copy of the image of its own for the pods that stop before training."""
    from e2e_image import charliecloud_copy
    root = charliecloud_copy(tmp_path_factory.mktemp("rcp-short") / "runai.image", runai_image)
    for mount_point in ("mnt/data", "mnt/runs"):
        (root / mount_point).mkdir(parents=True, exist_ok=True)
    return root


def test_a_bad_pod_is_named_by_the_preflight_and_every_pod_stops_with_76(twin, pod_root, cifar_data, tmp_path):
    # The worker pod was granted a GPU its container cannot see (a node whose GPU the driver lost):
    # doctor FAILs there alone. Both pods reach the same verdict from both reports and stop.
    runs = tmp_path / "runs"
    runs.mkdir()
    outputs = run_pods(twin, pod_root, ["/opt/ddp/runai/pod.sh", "--epochs", "1"], {cifar_data: "/mnt/data", runs: "/mnt/runs"},
                       "/mnt/runs/bad", changes=({}, {"RUNAI_NUM_OF_GPUS": "1"}), expect=(76, 76))
    for text in outputs:
        assert re.search(r"^preflight: bad pod ddp-train-worker-0: ddp-launch doctor fails .*'gpus': 0 GPUs visible",
                         text, re.M), text
        assert "preflight: every pod of the job stops (exit 76)" in text
        assert "fabric gate" not in text.split("preflight: every pod")[1]  # no gate, no training after it
    assert not (runs / "bad" / "metrics.jsonl").exists()


# The training operator's nprocPerNode, passed as PET_NPROC_PER_NODE ("supported values: [auto, cpu,
# gpu, int]", kubeflow/training-operator pkg/apis/kubeflow.org/v1/pytorch_types.go), counted against
# the image's own torchrun (torch.distributed.run.determine_local_world_size) in the same pod.
def test_each_nproc_per_node_value_counts_as_the_images_torchrun_counts_it(twin, pod_root):
    env = {k: v for k, v in pod_env(twin, pod_root, 0, "/mnt/runs/x").items()
           if not k.startswith("RUNAI_")}  # a Kubeflow PyTorchJob's pod
    counted = run_one(twin, pod_root, env, {}, ["python3", "-c", "from torch.distributed.run import "
                                                "determine_local_world_size as n; print(n('cpu'), n('auto'))"])
    assert counted.returncode == 0, counted.stderr
    cpu, auto = counted.stdout.split()
    for value, workers in (("cpu", cpu), ("auto", auto), ("3", "3")):
        done = run_one(twin, pod_root, {**env, "PET_NPROC_PER_NODE": value}, {}, ["ddp-launch", "--dry-run", "--json"])
        assert done.returncode == 0, done.stderr
        assert f"--nproc-per-node={workers}" in json.loads(done.stdout)["argv"], done.stdout
    # The image's torchrun raises "Cuda is not available" here: no training on CPU in its place. The
    # launcher asks the driver itself, which this pod has not (no GPU, no driver libraries).
    done = run_one(twin, pod_root, {**env, "PET_NPROC_PER_NODE": "gpu"}, {}, ["ddp-launch", "--dry-run", "--json"])
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("ddp-launch: error: PET_NPROC_PER_NODE=gpu but CUDA cannot use a GPU here "
                                  "(libcuda.so.1 not found"), done.stderr


def test_a_claim_the_pods_user_cannot_write_stops_it_in_one_line_with_the_fix(twin, pod_root, cifar_data, tmp_path):
    # RCP's scratch claim holds /mloscratch/homes/<user>, made by the user's uid with mode 0755; a pod
    # running as another uid (the image's) cannot make its run dir there.
    claim = tmp_path / "claim"
    (claim / "homes" / "alice").mkdir(parents=True)
    _reachable(claim / "homes" / "alice")
    _reachable(pod_root / "ch")
    env = {**pod_env(twin, pod_root, 0, "/mnt/runs/homes/alice/runs/r1"), "USER": "ddp-e2e", "HOME": "/tmp"}
    done = run_one(twin, pod_root, env, {cifar_data: "/mnt/data", claim: "/mnt/runs"},
                   ["/opt/ddp/runai/pod.sh", "--epochs", "1"], user=(TEST_UID, TEST_UID))
    assert done.returncode == 2, done.stderr
    error = done.stderr.splitlines()[-1]
    assert error.startswith("pod: error: cannot write the run dir /mnt/runs/homes/alice/runs/r1 (mkdir: cannot create "
                            "directory '/mnt/runs/homes/alice/runs': Permission denied) ")
    # Unprivileged ch-run maps only its user into its user namespace: the claim's owner (root here, the
    # user's uid on RCP) shows as the overflow id (user_namespaces(7), /proc/sys/kernel/overflowuid).
    overflow = Path("/proc/sys/kernel/overflowuid").read_text().strip(), Path("/proc/sys/kernel/overflowgid").read_text().strip()
    assert (f"as uid {TEST_UID} gid {TEST_UID}: /mnt/runs/homes/alice is uid {overflow[0]} gid {overflow[1]}, mode 755; "
            f"submit the pods as its owner (RUNAI_RUN_AS=UID:GID runai/submit.sh, on RCP your ids from id on "
            f"haas001.rcp.epfl.ch") in error
    assert not (claim / "homes" / "alice" / "runs").exists()


def elastic_pod_env(twin_cluster, root: Path, rank: int, run_dir: str) -> dict:
    """A pod of an elastic Kubeflow PyTorchJob (elasticPolicy minReplicas 1, maxReplicas 2, rdzvHost the
    first pod, rdzvConf last_call_timeout=1): PET_NNODES=MIN:MAX and PET_RDZV_ENDPOINT, no rank and no
    master (kubeflow/training-operator pkg/controller.v1/pytorch/elastic.go), one worker per pod."""
    dropped = ("PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "MASTER_ADDR", "MASTER_PORT", "RANK",
               "WORLD_SIZE")
    env = {k: v for k, v in pod_env(twin_cluster, root, rank, run_dir).items()
           if not k.startswith("RUNAI_") and k not in dropped}
    return {**env, "PET_NNODES": "1:2", "PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "3",
            "PET_RDZV_ENDPOINT": f"{twin_cluster.node_names[0]}:29533", "PET_NPROC_PER_NODE": "1",
            "PET_RDZV_CONF": "last_call_timeout=1"}


def records_of(metrics: Path) -> list:
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def trained_with_both(metrics: Path, timeout_s: float = 420) -> Callable[[], None]:
    """A wait until an epoch ended after the run's world grew to two pods, then the stop request a batch
    script's trap writes (ddp_contract.STOP_REQUEST_FILE): every rank checkpoints and exits 75."""
    def wait():
        deadline = time.monotonic() + timeout_s
        while True:
            records = records_of(metrics)
            grown = [i for i, r in enumerate(records) if r["type"] == "run" and r["nodes"] == 2]
            if grown and any(r["type"] == "epoch" for r in records[grown[0]:]):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no epoch on two pods in {timeout_s:.0f} s")
            time.sleep(1)
        request = metrics.parent / ".ddp-stop-request"
        request.with_suffix(".tmp").write_text("SIGUSR2\n")
        request.with_suffix(".tmp").rename(request)
    return wait


def test_a_late_pod_of_an_elastic_job_joins_the_training_without_a_gate(twin, pod_root, cifar_data, tmp_path):
    # The first pod checks itself, runs the gate alone and trains; the second starts once the first trains
    # (scaled up, or restarted later), finds the gate's rendezvous gone and the training's up, runs doctor
    # only, and joins: torchrun's elastic rendezvous admits it at its next round. Once an epoch ran on both,
    # the job is asked to stop (as a time limit would), and both pods checkpoint and exit 75.
    runs = tmp_path / "runs"
    runs.mkdir()
    envs = tuple(elastic_pod_env(twin, pod_root, rank, "/mnt/runs/elastic") for rank in (0, 1))
    metrics = runs / "elastic" / "metrics.jsonl"
    argv = ["/opt/ddp/runai/pod.sh", "--epochs", "50", "--batch-size", "64", "--width-scale", "0.125",
            "--target-accuracy", "1.01", "--checkpoint-every", "1", "--stop-check-every", "1",
            "--allow-unverified-data"]
    first, late = run_pods(twin, pod_root, argv, {cifar_data: "/mnt/data", runs: "/mnt/runs"}, "/mnt/runs/elastic", envs=envs,
                           start_after=(None, wait_for(metrics, "the first pod's training")),
                           meanwhile=trained_with_both(metrics), expect=(75, 75), timeout_s=480)
    assert "preflight: the fabric gate passed" in first, first
    assert re.search(r"^preflight: pod ddp-train-worker-0 joins the elastic job ddp-train late: its pods already "
                     r"train \(the training's rendezvous at [0-9.]+:29533 answers, the fabric gate's at port 29534 "
                     r"is gone\), so this pod runs no gate", late, re.M), late
    assert "fabric gate (launch included)" not in late and not (runs / "elastic" / "logs" / "gate" /
                                                                "ddp-train-worker-0").exists()
    runs_of = [r for r in records_of(metrics) if r["type"] == "run"]
    assert [(r["nodes"], r["world_size"]) for r in runs_of][:1] == [(1, 1)] and (2, 2) in [
        (r["nodes"], r["world_size"]) for r in runs_of], runs_of


# -- one's own script on the claim (README.md, "Your own training script": On RunAI and Kubeflow) -----------

OWN_SCRIPT = "/mnt/runs/code/env_ranks.py"


@pytest.fixture(scope="module")
def own_script_pods(twin, runai_image, cifar_data, tmp_path_factory):
    """Two pods of a runai/submit.sh submission of examples/env_ranks.py, copied onto the run claim as a
    user puts it there, run to their end: (argv, outputs, run dir)."""
    from e2e_image import charliecloud_copy
    work = tmp_path_factory.mktemp("rcp-own-script")
    submitted = submitted_runai_argv(work, "--script", OWN_SCRIPT, "--steps", "40")
    argv = pod_argv(dockerfile_entrypoint(), submitted)
    root = charliecloud_copy(work / "runai.image", runai_image)
    for mount_point in ("mnt/data", "mnt/runs"):
        (root / mount_point).mkdir(parents=True, exist_ok=True)
    runs = work / "runs"
    (runs / "code").mkdir(parents=True)
    (runs / "code" / "env_ranks.py").write_text((REPO / "examples" / "env_ranks.py").read_text())
    run_dir = pod_env_settings(submitted)["DDP_RUN_DIR"]
    workload = submitted[submitted.index("--name") + 1]
    named = {"RUNAI_JOB_NAME": workload}
    outputs = run_pods(twin, root, argv, {cifar_data: "/mnt/data", runs: "/mnt/runs"}, run_dir, changes=(named, named))
    return argv, outputs, runs / run_dir[len("/mnt/runs/"):]


def test_runai_pods_run_ones_own_script_from_the_claim_after_their_checks(own_script_pods):
    argv, outputs, run_dir = own_script_pods
    assert argv == ["/opt/ddp/runai/pod.sh", "--script", OWN_SCRIPT, "--steps", "40"]
    master = outputs[0]
    assert "ranks [0, 1] of 2, local ranks [0, 0], 2 host(s)" in master and "done: 40 steps" in master, master
    for text in outputs:
        assert f"pod: workload: --script {OWN_SCRIPT}, with 2 argument(s) of its own" in text, text
        assert "preflight: ddp-launch doctor passed in every pod (2)" in text and \
            "preflight: the fabric gate passed" in text, text
    reports = run_dir / "preflight" / job_id(run_dir.name).replace("/", "_")
    for report in sorted(reports.glob("doctor-*.json")):
        checks = {check["name"]: check for check in json.loads(report.read_text())["checks"]}
        assert checks["workload"]["status"] == "OK" and checks["dataset"]["status"] == "SKIP", report
    assert json.loads((run_dir / "manifest.json").read_text())["workload"]["script"] == OWN_SCRIPT
