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

The module's two pods run to their end once: pod.sh's checks, `ddp-launch preflight` (doctor in each
pod, one verdict, the fabric gate across them), the training, into a run dir where an earlier
container of the master pod left its lock (PID 1, a container restarted in its pod). The other
situations are pods that stop before training: a bad pod named by the preflight, each
PET_NPROC_PER_NODE value, a claim the pod's user cannot write.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import twins
from apptainer_root import TEST_UID
from conftest import CLUSTER_SH, REPO, _reachable, container_versions

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


# The workload as Run:ai names it in its pods (NVIDIA Run:ai docs, "Workloads", Built-in Workload
# Environment Variables), and the job identity ddp-launch derives from it (schedulers/kubeflow.py).
WORKLOAD_UUID = "6fb7f0fa-3c2e-4b8a-9d41-0f2a5c7e9b13"


def job_id(workload: str) -> str:
    return f"{workload}/{WORKLOAD_UUID}"


def pod_env(twin_cluster, root: Path, rank: int, run_dir: str) -> dict:
    """A pod's environment: the image's ENV plus what Kubernetes, the training operator and RunAI set
    (the master's name in PET_MASTER_ADDR, its Service; RunAI's MASTER_ADDR the master pod's IP);
    nothing from the host."""
    master = twin_cluster.node_names[0]
    return {**image_env(root), "HOSTNAME": twin_cluster.node_names[rank], "HOME": "/root", "USER": "root",
            # Kubernetes sets these in every container ("Accessing the Kubernetes API from a Pod").
            "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
            "RUNAI_JOB_NAME": "ddp-train", "RUNAI_JOB_UUID": WORKLOAD_UUID, "RUNAI_PROJECT": "e2e",
            "PET_NNODES": "2", "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": master, "PET_MASTER_PORT": "29533",
            "MASTER_ADDR": twin_cluster.address(master), "MASTER_PORT": "29533", "RANK": str(rank),
            "WORLD_SIZE": "2", "RUNAI_NUM_OF_GPUS": "0", "DDP_DATA_DIR": "/mnt/data", "DDP_RUN_DIR": run_dir}


def pod_command(twin_cluster, node: str, root: Path, env: dict, binds: dict, argv: list, as_user: bool = False) -> list:
    """ch-run in node's namespaces (as root, or as the test user: a pod's user that is not the claim's)."""
    user = ["setpriv", f"--reuid={TEST_UID}", f"--regid={TEST_UID}", "--clear-groups"] if as_user else []
    mounts = [word for source, target in binds.items() for word in ("-b", f"{source}:{target}")]
    return [str(CLUSTER_SH), "exec", node, "env", "-i", *[f"{k}={v}" for k, v in env.items()],
            *user, "ch-run", *mounts, str(root), "--", *argv]


def wait_for(path: Path, what: str, timeout_s: float = 240) -> Callable[[], None]:
    """A wait until path exists (a pod's container starts after it: a pod restarted more slowly)."""
    def wait():
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} ({path}) did not come in {timeout_s:.0f} s")
            time.sleep(0.5)
    return wait


def run_pods(twin_cluster, root: Path, argv: list, data: Path, runs: Path, run_dir: str,
             changes: tuple = ({}, {}), expect: tuple = (0, 0), start_after: tuple = (None, None),
             envs: tuple | None = None, meanwhile: Callable[[], None] | None = None,
             timeout_s: float = 300) -> list[str]:
    """One pod per twin node, as the training operator starts a PyTorchJob's, each with its
    environment's changes (or its whole environment, envs) and, where start_after gives one, started
    once that wait returns; meanwhile, what the test does while they run; their outputs, once each
    exited as expected."""
    pods = []
    for rank, node in enumerate(twin_cluster.node_names):
        env = envs[rank] if envs else {**pod_env(twin_cluster, root, rank, run_dir), **changes[rank]}
        command = pod_command(twin_cluster, node, root, env, {data: "/mnt/data", runs: "/mnt/runs"}, argv)
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


def run_one(twin_cluster, root: Path, env: dict, binds: dict, argv: list, as_user: bool = False, rank: int = 0):
    """One container in a pod's node (the master's unless rank says), to its end (a dry run, a pod that stops
    early)."""
    command = pod_command(twin_cluster, twin_cluster.node_names[rank], root, env, binds, argv, as_user)
    print("+ " + shlex.join(command), flush=True)
    done = subprocess.run(command, env=twin_cluster.env, capture_output=True, text=True, timeout=120)
    print(done.stdout, done.stderr)
    return done


@pytest.fixture(scope="module")
def submissions(tmp_path_factory) -> list:
    """Two runai/submit.sh submissions in a row under the same RUNAI_JOB_NAME (the default), as a
    user resubmits: the argv the stand-in took for each."""
    work = tmp_path_factory.mktemp("rcp-submit")
    trainer_args = ("--epochs", "1", "--batch-size", "64", "--width-scale", "0.125", "--allow-unverified-data")
    return [submitted_runai_argv(work, *trainer_args) for _ in range(2)]


@pytest.fixture(scope="module")
def pods(twin, runai_image, cifar_data, tmp_path_factory, submissions):
    """The two pods of the first runai/submit.sh submission, run to their end, as RunAI names them:
    RUNAI_JOB_NAME is the workload's name, which is the new run's."""
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
    workload = submissions[0][submissions[0].index("--name") + 1]
    # What the master pod's earlier container left: it was restarted in its pod (the kubelet restarts a
    # container after it exits), which keeps the pod's name and starts PID 1 again (alive here).
    here = runs / run_dir[len("/mnt/runs/"):]
    here.mkdir()
    (here / ".ddp-run.lock").write_text(json.dumps(
        {"job": job_id(workload), "host": twin.node_names[0], "pid": 1, "pid_space": "an-earlier-container/1",
         "since": 0}))
    # What the worker pod's container of an hour ago left on the claim: its failing doctor report. This
    # attempt's worker container starts late, after the master's doctor wrote its report (a container
    # restarted more slowly than the other); the master must wait for the worker's new report, not judge it
    # by the old one.
    reports = here / "preflight" / job_id(workload).replace("/", "_")
    reports.mkdir(parents=True)
    stale = reports / f"doctor-{twin.node_names[1]}.json"
    stale.write_text(json.dumps({"ok": False, "checks": [{"name": "gpus", "status": "FAIL", "fix": "replace it",
                                                          "detail": "0 GPUs visible but 1 granted"}]}))
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    named = {"RUNAI_JOB_NAME": workload}
    master_report = wait_for(reports / f"doctor-{twin.node_names[0]}.json", "the master pod's doctor report")
    outputs = run_pods(twin, root, argv, cifar_data, runs, run_dir, changes=(named, named),
                       start_after=(None, master_report))
    return argv, outputs, here


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
    outputs = run_pods(twin, pod_root, ["/opt/ddp/runai/pod.sh", "--epochs", "1"], cifar_data, runs,
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
                   ["/opt/ddp/runai/pod.sh", "--epochs", "1"], as_user=True)
    assert done.returncode == 2, done.stderr
    error = done.stderr.splitlines()[-1]
    assert error.startswith("pod: error: cannot write the run dir /mnt/runs/homes/alice/runs/r1 (mkdir: cannot create "
                            "directory '/mnt/runs/homes/alice/runs': Permission denied) ")
    # Unprivileged ch-run maps only its user into its user namespace: the claim's owner (root here, the
    # user's uid on RCP) shows as the overflow id (user_namespaces(7), /proc/sys/kernel/overflowuid).
    overflow = Path("/proc/sys/kernel/overflowuid").read_text().strip(), Path("/proc/sys/kernel/overflowgid").read_text().strip()
    assert (f"as uid {TEST_UID} gid {TEST_UID}: /mnt/runs/homes/alice is uid {overflow[0]} gid {overflow[1]}, mode 755; "
            f"submit the pods as its owner (runai submit ... --run-as-uid UID --run-as-gid GID") in error
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
    first, late = run_pods(twin, pod_root, argv, cifar_data, runs, "/mnt/runs/elastic", envs=envs,
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
    outputs = run_pods(twin, root, argv, cifar_data, runs, run_dir, changes=(named, named))
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
