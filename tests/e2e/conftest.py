"""Fixtures for the end-to-end tests: a real SLURM cluster in network namespaces.

The cluster is built once per session by tests/e2e/cluster/cluster.sh and always
torn down; every command a test runs is logged with its output, so a failure
explains itself (pyxis's bats helpers do the same).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import e2e_image as image
import pytest

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "tests" / "e2e" / "cluster" / "cluster.sh"
STATE = Path(os.environ.get("DDP_E2E_STATE", "/tmp/ddp-e2e-cluster"))
# cluster.sh's names and addresses; the variables let one cluster per working tree coexist.
PREFIX = os.environ.get("DDP_E2E_PREFIX", "ddpe2e")
SUBNET = os.environ.get("DDP_E2E_SUBNET", "10.77.0")
# Four: the fabric gate's tests run a 3-node job (a slow node is told apart by comparing pairs)
# and requeue a 2-node job onto a spare; the other tests use two.
NODES = int(os.environ.get("DDP_E2E_NODES", "4"))
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to build network namespaces and run slurmd"
    for tool in ("ip", "unshare", "nsenter", "munged", "slurmctld", "slurmd", "srun"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (make sysdeps installs slurm-wlm, munge, iproute2)"
    probe = f"{PREFIX}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns is not possible here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _log(text: str) -> None:
    print(text, flush=True)


@dataclass(frozen=True)
class Job:
    job_id: str
    state: str
    exit_code: str
    fields: dict

    @property
    def std_out(self) -> Path:
        return Path(self.fields["StdOut"])

    @property
    def std_err(self) -> Path:
        return Path(self.fields["StdErr"])

    def output(self) -> str:
        text = self.std_out.read_text(errors="replace") if self.std_out.exists() else ""
        if self.std_err != self.std_out and self.std_err.exists():
            text += self.std_err.read_text(errors="replace")
        return text


@dataclass(frozen=True)
class Cluster:
    """A running cluster and the environment its clients need (SLURM_CONF, PATH)."""

    state: Path
    nodes: int
    env: dict

    @property
    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(1, self.nodes + 1)]

    @staticmethod
    def address(node: str) -> str:
        """A node's address on the cluster bridge: nodeK is SUBNET.(10+K), as cluster.sh sets it."""
        return f"{SUBNET}.{10 + int(node.removeprefix('node'))}"

    @staticmethod
    def netns(node: str) -> str:
        return f"{PREFIX}-{node}"

    def run(self, argv: list[str], timeout: float = 120, cwd: Path | None = None,
            env: dict | None = None) -> subprocess.CompletedProcess:
        _log("+ " + shlex.join(str(a) for a in argv))
        merged = {**self.env, **(env or {})}
        try:
            done = subprocess.run([str(a) for a in argv], cwd=cwd or REPO, env=merged,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            _log(f"+ timed out after {timeout}s\n{expired.stdout or ''}{expired.stderr or ''}")
            raise
        _log(done.stdout + done.stderr + f"+ exit status: {done.returncode}")
        return done

    def sbatch(self, argv: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
        done = self.run(["sbatch", "--parsable", *argv], cwd=cwd, env=env, timeout=30)
        assert done.returncode == 0, f"sbatch failed: {done.stderr}"
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> Job:
        done = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.env,
                              capture_output=True, text=True, timeout=30)
        fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
        return Job(job_id, fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", ""), fields)

    def wait(self, job_id: str, timeout: float, states: set[str] = TERMINAL_STATES) -> Job:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if job.state in states:
                _log(f"+ job {job_id}: {job.state} exit {job.exit_code}")
                return job
            if time.monotonic() > deadline:
                self.run(["scancel", job_id], timeout=30)
                pytest.fail(f"job {job_id} still {job.state} after {timeout}s:\n{job.output()}")
            time.sleep(0.5)

    def job_nodes(self, job: Job) -> list[str]:
        """The nodes SLURM gave the job, in order (its first node runs rank 0)."""
        done = subprocess.run(["scontrol", "show", "hostnames", job.fields["NodeList"]], env=self.env,
                              capture_output=True, text=True, timeout=30)
        return done.stdout.split()

    def wait_for_file(self, path: Path, timeout: float, predicate=lambda p: p.exists()) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(path):
            if time.monotonic() > deadline:
                pytest.fail(f"{path} did not appear within {timeout}s")
            time.sleep(0.5)

    def node_exec(self, node: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        return self.run([CLUSTER_SH, "exec", node, *argv], timeout=timeout)

    def cancel_all(self) -> None:
        subprocess.run(["scancel", "--full", "--partition=e2e"], env=self.env, capture_output=True,
                       timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                                   text=True, timeout=30)
            if not queue.stdout.strip():
                return
            time.sleep(0.5)

    def logs(self) -> str:
        parts = []
        for log in sorted((self.state / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = _skip_reason()
    if reason:
        print(f"e2e: skipping, {reason}", file=sys.stderr)
        pytest.skip(reason)
    env = {
        **os.environ,
        "SLURM_CONF": str(STATE / "etc" / "slurm.conf"),
        "DDP_E2E_STATE": str(STATE),
        # The venv that runs pytest is what the nodes run: same filesystem.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    subprocess.run([CLUSTER_SH, "down"], env=env, capture_output=True, timeout=120)
    try:
        up = subprocess.run([CLUSTER_SH, "up", str(NODES)], env=env, capture_output=True,
                            text=True, timeout=180)
        if up.returncode != 0:
            pytest.fail(f"cluster.sh up failed:\n{up.stderr}")
        yield Cluster(STATE, NODES, env)
    finally:
        subprocess.run([CLUSTER_SH, "down"], env=env, capture_output=True, timeout=120)


@pytest.fixture
def cluster(slurm_cluster: Cluster, request):
    """The session cluster, emptied of jobs after each test; logs shown on failure."""
    yield slurm_cluster
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        _log(slurm_cluster.logs())
    slurm_cluster.cancel_all()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report


SHIM_BIN = REPO / "tests" / "e2e" / "bin"  # apptainer: the ch-run stand-in


@pytest.fixture(scope="session")
def container_image() -> str:
    """The image built by ch-image from containers/Dockerfile on the cached test base."""
    reason = image.missing_tools()
    if reason:
        print(f"e2e: skipping container tests, {reason}", file=sys.stderr)
        pytest.skip(f"container tests: {reason}")
    try:
        return image.build()
    except image.ImageError as error:
        pytest.fail(f"building the e2e image failed: {error}")


def container_versions(sif: Path) -> dict:
    """Python and torch as the image has them (they differ from this venv's: proof of where a run ran)."""
    code = "import json, platform, torch; print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__}))"
    done = subprocess.run([str(SHIM_BIN / "apptainer"), "exec", str(sif), "python3", "-c", code],
                          cwd=sif.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def sif(container_image: str, tmp_path: Path) -> Path:
    """What the job scripts take for a SIF: a file naming this test's copy of the image."""
    return image.write_pointer(tmp_path / "train.sif", container_image)
TRAIN_ARGS = "--epochs 2 --batch-size 64 --width-scale 0.25 --allow-unverified-data"


@pytest.fixture(scope="session")
def cifar_data(tmp_path_factory) -> Path:
    """Small CIFAR-100-format data, as `make data` would stage it (generated, learnable)."""
    out = tmp_path_factory.mktemp("data")
    subprocess.run([sys.executable, "-m", "ddp_train.synthetic", str(out), "--train", "512",
                    "--test", "128", "--seed", "1"], check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture
def job_env(cluster: Cluster, cifar_data: Path, tmp_path: Path, sif: Path) -> dict:
    """What a user sets before sbatch of a slurm/ script, pointed at this test's dirs.

    apptainer is the ch-run stand-in, so every step runs in a container of the image
    built from the real recipe; the site is "generic" (this machine has no Slingshot
    libraries to bind); GPUs are not requested (sbatch --gpus-per-node=0), so
    ddp-launch runs 2 CPU workers.
    """
    return {
        "PATH": f"{SHIM_BIN}{os.pathsep}{cluster.env['PATH']}",
        "DDP_REPO": str(REPO),
        "DDP_IMAGE": str(sif),
        "DDP_SITE": "generic",
        "DDP_DATA_DIR": str(cifar_data),
        "DDP_RUN_DIR": str(tmp_path / "run"),
        "DDP_TRAIN_ARGS": TRAIN_ARGS,
        "DDP_LAUNCH_CPU_WORKERS": "2",
        "DDP_MONITOR_INTERVAL": "1",
    }


def metrics_records(run_dir: Path) -> list[dict]:
    """The trainer's metrics.jsonl records so far (none before its first line)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def epochs_done(run_dir: Path) -> int:
    return sum(1 for r in metrics_records(run_dir) if r["type"] == "epoch")


def sbatch_args(tmp_path: Path, *extra: str) -> list[str]:
    """Overrides a site's sbatch lines need on the test cluster: its partition, no GPUs."""
    return ["--partition=e2e", "--gpus-per-node=0", f"--output={tmp_path}/%j.out", *extra]
