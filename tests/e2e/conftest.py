"""Fixtures for the end-to-end tests: a real SLURM cluster in network namespaces, with
the real Apptainer on its nodes.

The cluster is built once per session by tests/e2e/cluster/cluster.sh and always
torn down; every command a test runs is logged with its output, so a failure
explains itself (pyxis's bats helpers do the same). The cluster's daemons and clients
run in a Debian sid root (tests/e2e/apptainer_root.py) with the host paths the tests
use bound in at the same paths: Cluster.run enters it as root, Cluster.sbatch and
Cluster.as_user as the unprivileged test user, who runs Apptainer.
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
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import apptainer_root
import documented_blocks
import e2e_image as image
import pytest
import scheduling
import twins

REPO = Path(__file__).resolve().parents[2]
CLUSTER_SH = REPO / "tests" / "e2e" / "cluster" / "cluster.sh"
# pytest-xdist's worker number (its PYTEST_XDIST_WORKER is gw0, gw1, ...): `make test` runs the e2e
# modules on two workers, each with a cluster of its own (its twins follow it: twins.cluster_settings).
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
# Worker K's subnets and ports start this far past worker 0's, beyond its twins' (slots up to 6, twins.py).
WORKER_SUBNET_STRIDE = 16
WORKER_PORT_STRIDE = 20


def worker_settings(env: dict, worker: int) -> tuple[str, str, int, Path]:
    """cluster.sh's prefix, subnet, port and state for an xdist worker: the variables' values (the
    defaults let one cluster per working tree coexist) for worker 0, offset ones for the others."""
    prefix = env.get("DDP_E2E_PREFIX", "ddpe2e")
    subnet = env.get("DDP_E2E_SUBNET", "10.77.0")
    port = int(env.get("DDP_E2E_PORT", "46817"))
    state = Path(env.get("DDP_E2E_STATE", "/tmp/ddp-e2e-cluster"))
    if worker == 0:
        return prefix, subnet, port, state
    a, b, c = subnet.split(".")
    third = int(c) + WORKER_SUBNET_STRIDE * worker
    if third + WORKER_SUBNET_STRIDE > 255:
        raise ValueError(f"DDP_E2E_SUBNET={subnet} leaves no room for xdist worker {worker}'s subnets")
    # Short: interface names carry the prefix and stay under 15 characters (twins add 2, cluster.sh 6).
    return (f"{prefix[:5]}w{worker}", f"{a}.{b}.{third}", port + WORKER_PORT_STRIDE * worker,
            state.with_name(f"{state.name}-w{worker}"))


PREFIX, SUBNET, PORT, STATE = worker_settings(dict(os.environ), WORKER)
# Six: the spare-node tests run a 3-node job with one spare (4 nodes) and, once its spare is used up,
# requeue it without two bad nodes onto the other two; the fabric gate's tests run a 3-node job (a
# slow node is told apart by comparing pairs); the other tests use two.
NODES = int(os.environ.get("DDP_E2E_NODES", "6"))
TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                   "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


# Jobs run as the test user and write into tmp_path, so every directory above it must let
# that user through; pytest makes /tmp/pytest-of-root 0700 again at each session's start
# (its tmp_path docs: the base directory is private to the user), and on a machine shared
# by several checkouts another session would do so under a running one. Each cluster
# gets a temporary root of its own (read lazily by pytest, at the first tmp_path).
TEMP_ROOT = Path(f"/tmp/ddp-e2e-tmp-{PREFIX}")
if os.geteuid() == 0 and "PYTEST_DEBUG_TEMPROOT" not in os.environ:
    TEMP_ROOT.mkdir(mode=0o711, exist_ok=True)
    TEMP_ROOT.chmod(0o711)
    os.environ["PYTEST_DEBUG_TEMPROOT"] = str(TEMP_ROOT)

# The test user's login environment in the root (what a shell on a login node has).
USER_HOME = f"/home/{apptainer_root.TEST_USER}"
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to build network namespaces and run slurmd"
    for tool in ("ip", "unshare", "nsenter", "pivot_root", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (make sysdeps installs iproute2, util-linux, debootstrap)"
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
        # SLURM 26.05 leaves StdErr empty when it goes to StdOut.
        return Path(self.fields["StdErr"]) if self.fields.get("StdErr") else self.std_out

    def output(self) -> str:
        text = self.std_out.read_text(errors="replace") if self.std_out.exists() else ""
        if self.std_err != self.std_out and self.std_err.exists():
            text += self.std_err.read_text(errors="replace")
        return text


@dataclass(frozen=True)
class Cluster:
    """A running cluster and the environment its clients need (SLURM_CONF, PATH): the session's
    plain one (node1..nodeN) or a twin (tests/e2e/twins.py), whose names and interface are its own."""

    state: Path
    names: tuple[str, ...]
    env: dict
    prefix: str = PREFIX
    subnet: str = SUBNET
    interface: str = "eth0"     # the cluster network's interface in each node

    @property
    def nodes(self) -> int:
        return len(self.names)

    @property
    def node_names(self) -> list[str]:
        return list(self.names)

    def address(self, node: str) -> str:
        """A node's address on the cluster bridge: the K-th node is SUBNET.(10+K), as cluster.sh sets it."""
        return f"{self.subnet}.{11 + self.names.index(node)}"

    def netns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def in_root(self, argv: list, cwd: Path | None = None, user: bool = False) -> list[str]:
        """argv run in the cluster's root (its mount namespace), as root or the test user."""
        holder = (self.state / "run" / "holder.pid").read_text().strip()
        # nsenter's --wd=DIR would open DIR out here, a directory the root cannot name;
        # env -C changes to it inside.
        enter = ["nsenter", f"--target={holder}", "--mount", "--root", "--wd", "env", "-C", str(cwd or REPO)]
        if user:
            enter += ["setpriv", f"--reuid={apptainer_root.TEST_UID}", f"--regid={apptainer_root.TEST_UID}",
                      "--init-groups", "--"]
        return enter + [str(a) for a in argv]

    def user_env(self, env: dict | None = None) -> dict:
        """The test user's login environment plus env: nothing of root's or pytest's."""
        base = {"PATH": USER_PATH, "HOME": USER_HOME, "USER": apptainer_root.TEST_USER,
                "LOGNAME": apptainer_root.TEST_USER, "LANG": "C.UTF-8", "SLURM_CONF": self.env["SLURM_CONF"]}
        return {**base, **(env or {})}

    def run(self, argv: list[str], timeout: float = 120, cwd: Path | None = None,
            env: dict | None = None, user: bool = False) -> subprocess.CompletedProcess:
        """argv in the cluster's root: as root with this session's environment, or as the
        test user with user_env(env)."""
        _log(("+ [user] " if user else "+ ") + shlex.join(str(a) for a in argv))
        merged = self.user_env(env) if user else {**self.env, **(env or {})}
        try:
            done = subprocess.run(self.in_root(argv, cwd, user), env=merged,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            _log(f"+ timed out after {timeout}s\n{expired.stdout or ''}{expired.stderr or ''}")
            raise
        _log(done.stdout + done.stderr + f"+ exit status: {done.returncode}")
        return done

    def as_user(self, argv: list, timeout: float = 120, cwd: Path | None = None,
                env: dict | None = None) -> subprocess.CompletedProcess:
        return self.run(argv, timeout=timeout, cwd=cwd, env=env, user=True)

    def sbatch(self, argv: list[str], cwd: Path | None = None, env: dict | None = None) -> str:
        """Submitted by the test user (cluster users are not root; Apptainer refuses root here)."""
        done = self.as_user(["sbatch", "--parsable", *argv], cwd=cwd, env=env, timeout=30)
        assert done.returncode == 0, f"sbatch failed: {done.stderr}"
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> Job:
        done = subprocess.run(self.in_root(["scontrol", "-o", "show", "job", job_id]), env=self.env,
                              capture_output=True, text=True, timeout=30)
        fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
        return Job(job_id, fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", ""), fields)

    # The timeouts of wait and wait_for_file bound a hang; they are not what a test asserts (a test whose
    # point is speed measures the time itself). Under `make test` three clusters share 2 cores at a load
    # near 20, where a job that takes 40 s alone takes minutes, so a bound is most of 10 minutes.
    def wait(self, job_id: str, timeout: float, states: set[str] = TERMINAL_STATES) -> Job:
        started = time.monotonic()
        deadline = started + timeout
        while True:
            job = self.job(job_id)
            if job.state in states:
                _log(f"+ job {job_id}: {job.state} exit {job.exit_code}")
                return job
            if time.monotonic() > deadline:
                self.run(["scancel", job_id], timeout=30)
                pytest.fail(f"job {job_id} still {job.state} after {timeout}s:\n{job.output()}")
            time.sleep(poll_pause(started))

    def job_nodes(self, job: Job) -> list[str]:
        """The nodes SLURM gave the job, in order (its first node runs rank 0)."""
        done = subprocess.run(self.in_root(["scontrol", "show", "hostnames", job.fields["NodeList"]]),
                              env=self.env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    def wait_for_file(self, path: Path, timeout: float, predicate=lambda p: p.exists()) -> None:
        started = time.monotonic()
        deadline = started + timeout
        while not predicate(path):
            if time.monotonic() > deadline:
                pytest.fail(f"{path} did not appear within {timeout}s")
            time.sleep(poll_pause(started))

    def in_netns(self, node: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """argv in a node's network namespace, run from this host (cluster.sh made the namespaces
        here: the cluster's root has no /run/netns), as root: tc(8) and ip-link(8) changes."""
        _log(f"+ [{node}] " + shlex.join(argv))
        done = subprocess.run(["ip", "netns", "exec", self.netns(node), *argv], capture_output=True, text=True,
                              timeout=timeout)
        _log(done.stdout + done.stderr + f"+ exit status: {done.returncode}")
        return done

    def cluster_sh(self, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
        """cluster.sh ARGV from this host, where it made the namespaces (crash, revive, exec)."""
        _log("+ cluster.sh " + shlex.join(str(a) for a in argv))
        done = subprocess.run([str(CLUSTER_SH), *[str(a) for a in argv]], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        _log(done.stdout + done.stderr + f"+ exit status: {done.returncode}")
        return done

    def node_exec(self, node: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
        """argv as root on a node: its network, host name and mount namespace (inside the root)."""
        return self.cluster_sh(["exec", node, *argv], timeout=timeout)

    def needs_nodes(self, count: int) -> None:
        if self.nodes < count:
            pytest.fail(f"this test needs {count} nodes: run with DDP_E2E_NODES={count}")

    @contextmanager
    def renamed_nic(self, node: str, new: str = "ens1f1"):
        """One node's NIC under another name (a node whose NIC is ens1f1 where the job says eth0, as in
        mixed clusters), renamed back on the way out. A link is renamed only while down (ip-link(8))."""
        for argv in (["ip", "link", "set", "eth0", "down"], ["ip", "link", "set", "eth0", "name", new],
                     ["ip", "link", "set", new, "up"]):
            done = self.in_netns(node, argv)
            assert done.returncode == 0, done.stderr
        try:
            yield
        finally:
            for argv in (["ip", "link", "set", new, "down"], ["ip", "link", "set", new, "name", "eth0"],
                         ["ip", "link", "set", "eth0", "up"]):
                self.in_netns(node, argv)

    def job_processes(self) -> list[str]:
        """'node:pid:command' of every job process left on any node: ours, the image's FUSE mount and
        Apptainer's starter (whose command line is its process title)."""
        found = []
        for node in self.node_names:
            pids = subprocess.run(["ip", "netns", "pids", self.netns(node)], capture_output=True, text=True).stdout
            for pid in pids.split():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if any(marker in cmdline for marker in JOB_PROCESS_MARKERS):
                    found.append(f"{node}:{pid}:{cmdline.replace(bytes([0]), b' ')[:80].decode(errors='replace')}")
        return found

    def settled(self, timeout: float = 90) -> list[str]:
        """The job processes still there once SLURM had time to end them (KillWait, srun --wait)."""
        deadline = time.monotonic() + timeout
        left = self.job_processes()
        while left and time.monotonic() < deadline:
            time.sleep(1)
            left = self.job_processes()
        return left

    def cancel_all(self) -> None:
        subprocess.run(self.in_root(["scancel", "--full", f"--user={apptainer_root.TEST_USER}"]), env=self.env,
                       capture_output=True, timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            queue = subprocess.run(self.in_root(["squeue", "-h", "-o", "%i"]), env=self.env,
                                   capture_output=True, text=True, timeout=30)
            if not queue.stdout.strip():
                return
            time.sleep(0.5)

    def logs(self) -> str:
        parts = []
        for log in sorted((self.state / "log").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-30:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def poll_pause(started: float) -> float:
    """Seconds to sleep before the next look at a job or a run dir, `started` (time.monotonic) being when
    the wait began: every half second for 10 s, then every 2 s. A look at a job runs scontrol in the
    cluster's root, about 11 ms of CPU with slurmctld's and munged's share (measured here): at two looks a
    second, a test that waits 5 minutes for its job spent 6.6 CPU-s on looking, and the e2e tests spend most
    of their hour on three workers waiting. A wait of minutes (a training, a requeue) loses at most 2 s to
    the longer pause; the short waits (a refusal, a job that stops in its batch script) keep the half second."""
    return 0.5 if time.monotonic() - started < 10 else 2.0


# What a job leaves running if it leaves anything (Cluster.job_processes).
JOB_PROCESS_MARKERS = (b"ddp_launch", b"ddp_train", b"torch.distributed.run", b"squashfuse_ll",
                       b"Apptainer runtime parent")


class SetupError(RuntimeError):
    """The test world (the cluster's root, the cluster, its images) could not be made. The
    message is one line: the step, the first error line of its log, and the log's path."""


# Where setup_failed also writes its line (tools/run_tests.py names the file): under pytest-xdist the
# worker that stops has no terminal of its own, and the controller reports only an INTERNALERROR.
SETUP_NOTE_VAR = "DDP_E2E_SETUP_NOTE"


def setup_failed(error: Exception) -> None:
    """Stop the whole e2e run at the first failure to build its world, in one line: every test
    after it would fail the same way, each with its own traceback (pytest.exit, "How to
    use pytest", https://docs.pytest.org/en/stable/reference/reference.html#pytest-exit)."""
    line = f"e2e setup failed: {error}"
    note = os.environ.get(SETUP_NOTE_VAR)
    if note:
        with open(note, "a", encoding="utf-8") as out:
            out.write(line + "\n")
    pytest.exit(line, returncode=SETUP_FAILED)


# pytest's own codes are 0 to 5 (pytest.ExitCode); this one says the tests never ran.
SETUP_FAILED = 6
UP_LOG = STATE.parent / f"{STATE.name}-up.log"  # cluster.sh down empties STATE


def start_cluster() -> Cluster:
    """cluster.sh up NODES in the Debian sid root (built first, or reused): what the session
    fixture and tests/e2e/soak.py start from. The caller stops it (stop_cluster)."""
    try:
        root = apptainer_root.build()
    except image.ImageError as error:
        raise SetupError(f"the cluster's root: {error}") from None
    _RAN["apptainer"] = f"{apptainer_root.apptainer_version(root)} (Debian sid root {root})"
    # Host paths the root sees at the same paths: this checkout, and the Python that
    # runs pytest (its venv's ddp-launch is srun directly by some tests).
    binds = [str(REPO), sys.base_prefix, sys.prefix]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DDP_E2E_TWIN")},
        "SLURM_CONF": str(STATE / "etc" / "slurm.conf"),
        "DDP_E2E_STATE": str(STATE),
        "DDP_E2E_PREFIX": PREFIX,
        "DDP_E2E_SUBNET": SUBNET,
        "DDP_E2E_PORT": str(PORT),
        "DDP_E2E_ROOT": str(root),
        "DDP_E2E_ROOT_BINDS": ":".join(binds),
        # The venv that runs pytest is what the nodes run: same filesystem.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    return cluster_up(env, NODES, STATE, UP_LOG)


def start_twin(twin: twins.Twin, session: Cluster) -> Cluster:
    """twin's cluster beside the session's (its own names, subnets, ports and state), with its node
    tree built first. The caller stops it (stop_twin)."""
    settings = twins.cluster_settings(twin, PREFIX, SUBNET, PORT, STATE)
    state = Path(settings["DDP_E2E_STATE"])
    try:
        twins.build_tree(twin, Path(settings["DDP_E2E_TWIN_TREE"]))
    except subprocess.CalledProcessError as error:
        raise SetupError(f"the {twin.name} twin's node tree: {shlex.join(map(str, error.cmd))} exit "
                         f"{error.returncode}: {image.first_error_line(error.stderr or '')}") from None
    env = {**session.env, **settings, "SLURM_CONF": str(state / "etc" / "slurm.conf")}
    return cluster_up(env, twin.nodes, state, state.parent / f"{state.name}-up.log")


def stop_twin(cluster: Cluster) -> None:
    stop_cluster(cluster.env)
    shutil.rmtree(cluster.env["DDP_E2E_TWIN_TREE"], ignore_errors=True)


def cluster_up(env: dict, nodes: int, state: Path, log: Path) -> Cluster:
    """cluster.sh up NODES with env (a stale cluster of the same state torn down first)."""
    stop_cluster(env)
    try:
        up = subprocess.run([CLUSTER_SH, "up", str(nodes)], env=env, capture_output=True, text=True, timeout=180)
        image.checked(up, f"cluster.sh up {nodes}" + (f" ({env['DDP_E2E_TWIN']} twin)" if env.get("DDP_E2E_TWIN") else ""),
                      log)
    except subprocess.TimeoutExpired:
        stop_cluster(env)
        raise SetupError(f"cluster.sh up {nodes}: no answer in 180 s (logs: {state}/log)") from None
    except image.ImageError as error:
        stop_cluster(env)
        raise SetupError(str(error)) from None
    names = tuple((state / "node-names").read_text().split())
    return Cluster(state, names, env, env.get("DDP_E2E_PREFIX", PREFIX), env.get("DDP_E2E_SUBNET", SUBNET),
                   (state / "interface").read_text().strip())


def stop_cluster(env: dict) -> None:
    subprocess.run([CLUSTER_SH, "down"], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = _skip_reason()
    if reason:
        print(f"e2e: skipping, {reason}", file=sys.stderr)
        pytest.skip(reason)
    try:
        started = start_cluster()
    except SetupError as error:
        setup_failed(error)
    try:
        yield started
    finally:
        stop_cluster(started.env)


@pytest.fixture
def cluster(slurm_cluster: Cluster, request):
    """The session cluster, emptied of jobs after each test; logs shown on failure."""
    yield slurm_cluster
    _after_test(slurm_cluster, request)


def _after_test(running: Cluster, request) -> None:
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        _log(running.logs())
    running.cancel_all()


@pytest.fixture(scope="module")
def twin(slurm_cluster: Cluster, request):
    """The twin of the module's TWIN (tests/e2e/twins.py), up for the module's tests and down before
    the next module's: one twin runs at a time, beside the session's cluster (whose test user builds
    the images)."""
    spec = request.module.TWIN
    try:
        started = start_twin(spec, slurm_cluster)
    except SetupError as error:
        setup_failed(error)
    try:
        yield started
    finally:
        stop_twin(started)


@pytest.fixture
def twin_cluster(twin: Cluster, request):
    """The module's twin, emptied of jobs after each test; logs shown on failure."""
    yield twin
    _after_test(twin, request)


@pytest.fixture(scope="session")
def lumi_sif(slurm_cluster: Cluster, images: image.Sifs) -> Path:
    """gpu.def built by `make build-lumi` on a LUMI-like base (e2e_image.build_lumi_sif)."""
    try:
        return image.build_lumi_sif(images, lambda argv: slurm_cluster.as_user(argv, timeout=1200),
                                    lambda argv: slurm_cluster.run(argv, timeout=1200), apptainer_root.TEST_UID)
    except image.ImageError as error:
        setup_failed(SetupError(f"the LUMI image: {error}"))


# How `make test` spreads the e2e tests over its workers: tests/e2e/scheduling.py.
# Half a minute or more here (a requeue, a collective's timeout, a second job, a fault waited out): dealt to the
# workers first (pytest_collection_modifyitems), so that the run ends on short tests, not on a long one alone
# while the other workers have nothing left (a 75 s test dealt last left one core idle for a minute).
LONG = pytest.mark.long
pytest_xdist_make_scheduler = scheduling.make_scheduler


def pytest_collection_modifyitems(items):
    for item in items:
        # The fixtures this test needs, its own and theirs (pytest's FixtureInfo: private, but the only
        # place that knows a fixture's scope at collection time).
        shared = sorted(name for name, definitions in item._fixtureinfo.name2fixturedefs.items()
                        if definitions[-1].scope == "module")
        if shared and item.module.__name__ not in scheduling.MODULES_SHARING_A_FIXTURE:
            raise pytest.UsageError(f"{item.nodeid} uses the module-scoped fixture(s) {', '.join(shared)}: add "
                                    f"{item.module.__name__} to MODULES_SHARING_A_FIXTURE in tests/e2e/scheduling.py")
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


_RAN: dict = {}


def pytest_terminal_summary(terminalreporter):
    """`make test` says which Apptainer the e2e tests ran."""
    if "apptainer" in _RAN:
        terminalreporter.write_line(f"e2e: ran {_RAN['apptainer']}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report


_VERSIONS: dict = {}


def build_images(cluster: Cluster) -> image.Sifs:
    """The x86_64 and CPU images, built by `make build-x86` / `make build-cpu` with the real
    `apptainer build` on the cached offline base SIF, by the test user; rebuilt when
    anything they are built from changed (e2e_image.project_key). Each is run once, to
    record its Python and torch (container_versions)."""
    try:
        sifs = image.build_sifs(lambda argv: cluster.as_user(argv, timeout=1200),
                                lambda argv: cluster.run(argv, timeout=1200), apptainer_root.TEST_UID)
    except image.ImageError as error:
        raise SetupError(f"the e2e images: {error}") from None
    except subprocess.TimeoutExpired as expired:
        raise SetupError(f"the e2e images: {shlex.join(map(str, expired.cmd[-4:]))} ran over "
                         f"{expired.timeout:.0f} s") from None
    code = "import json, platform, torch; print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__}))"
    for path in (sifs.x86, sifs.cpu):
        done = cluster.as_user(["apptainer", "exec", path, "python3", "-c", code], timeout=300)
        try:
            image.checked(done, f"apptainer exec {path.name} python3", image.CACHE / "logs" / f"exec-{path.stem}.log")
        except image.ImageError as error:
            raise SetupError(f"the e2e images: {error}") from None
        _VERSIONS[str(path)] = json.loads(done.stdout.splitlines()[-1])
    return sifs


@pytest.fixture(scope="session")
def images(slurm_cluster: Cluster) -> image.Sifs:
    try:
        return build_images(slurm_cluster)
    except SetupError as error:
        setup_failed(error)


def container_versions(sif: Path) -> dict:
    """Python and torch as the image has them (they differ from this venv's: proof of where a run ran)."""
    return _VERSIONS[str(sif)]


@pytest.fixture
def sif(images: image.Sifs) -> Path:
    """The SIF the job scripts take as DDP_IMAGE: gpu.def built for x86_64 (read-only, shared)."""
    return images.x86


@pytest.fixture(scope="session")
def runai_image() -> str:
    """The Charliecloud image built by ch-image from containers/Dockerfile on the cached
    test base: the RunAI pod path, which has no Apptainer."""
    reason = image.missing_tools()
    if reason:
        print(f"e2e: skipping RunAI pod tests, {reason}", file=sys.stderr)
        pytest.skip(f"RunAI pod tests: {reason}")
    try:
        return image.build()
    except image.ImageError as error:
        setup_failed(SetupError(f"the RunAI pods' Charliecloud image: {error}"))


@pytest.fixture
def runai_root(runai_image: str, tmp_path: Path) -> Path:
    """This test's own hard-linked copy of the Charliecloud image tree."""
    return image.charliecloud_copy(tmp_path / "runai.image", runai_image)


# A job that runs to its end trains the smallest model that still learns on the test data: width 0.125
# (277 k parameters) trains about 2.7x faster per CPU core than 0.25 (1.09 M), and every e2e job shares this
# machine's 2 cores with the rest of `make test`.
TRAIN_ARGS = "--epochs 2 --batch-size 64 --width-scale 0.125 --allow-unverified-data"
# A job a test acts on mid-run (a stop, a kill, a second job) needs seconds of runway for the action to
# land before the run ends, not work: the 0.125 model, with rank 0 sleeping in each step's backward
# (DDP_TEST_SLOW_RANK, a test-only switch: ddp_train/safety/steptime.py) while the other ranks wait for it
# in the gradient all-reduce, idle. An epoch (8 steps) lasts about as long as the 0.25 model's did on a
# quiet machine, about 4 s, for about a third of its CPU-seconds (measured side by side: 2 gloo ranks,
# the same epochs, 2.5x the wall time for the same CPU-seconds with the sleep). Under load the compute
# slows down and the runway grows; the sleep does not shrink.
MIDRUN_STEP_SLEEP_S = 0.4
MIDRUN_TRAIN_ARGS = TRAIN_ARGS


def midrun(epochs: int, *extra: str) -> dict:
    """What a job a test acts on mid-run sets: `epochs` epochs of MIDRUN_TRAIN_ARGS and extra trainer flags,
    rank 0 slowed (its step times name it a straggler, which these tests do not read)."""
    return {"DDP_TRAIN_ARGS": " ".join([MIDRUN_TRAIN_ARGS.replace("--epochs 2", f"--epochs {epochs}"), *extra]),
            "DDP_TEST_SLOW_RANK": f"0:{MIDRUN_STEP_SLEEP_S}"}


@pytest.fixture(scope="session")
def cifar_data(tmp_path_factory) -> Path:
    """Small CIFAR-100-format data, as `make data` would stage it (generated, learnable),
    readable by the test user."""
    return stage_data(tmp_path_factory.mktemp("data"))


def stage_data(out: Path) -> Path:
    """Small CIFAR-100-format data generated into out (as `make data` would stage it), readable
    by the test user."""
    subprocess.run([sys.executable, "-m", "ddp_train.synthetic", str(out), "--train", "512",
                    "--test", "128", "--seed", "1"], check=True, capture_output=True, timeout=120)
    subprocess.run(["chmod", "-R", "o+rX", str(out)], check=True)
    _reachable(out)
    return out


def _reachable(path: Path) -> None:
    """pytest makes its directories 0700: let the test user through them."""
    for parent in path.parents:
        if parent in (Path("/tmp"), Path("/")):
            break
        parent.chmod(parent.stat().st_mode | 0o001)


def user_dir(path: Path) -> Path:
    """path (made if missing) owned by the test user, who runs the jobs."""
    path.mkdir(parents=True, exist_ok=True)
    _reachable(path)
    os.chown(path, apptainer_root.TEST_UID, apptainer_root.TEST_UID)
    return path


# The fake nvidia-smi (tests/unit/doctor/data/gpu-health: a real driver-580 output changed per case)
# that a job's doctor finds first on the container's PATH: APPTAINERENV_PREPEND_PATH puts a directory
# there, after the image's %environment (Apptainer user guide, "Environment and Metadata").
GPU_HEALTH_FAKES = REPO / "tests" / "unit" / "doctor" / "data" / "gpu-health"


def fake_nvidia_smi_env(directory: Path, cases: dict) -> dict:
    """What a user's environment gets so that the doctor in the job's container reads the fake
    nvidia-smi: {node: case}; a case "a>b" answers the first reading with a and later ones with b."""
    fakes = user_dir(directory)
    shutil.copytree(GPU_HEALTH_FAKES, fakes, dirs_exist_ok=True)
    return {"APPTAINERENV_PREPEND_PATH": str(fakes / "bin"),
            "FAKE_NVIDIA_SMI_CASES": ",".join(f"{node}:{case}" for node, case in cases.items()),
            "FAKE_NVIDIA_SMI_STATE": str(user_dir(directory / "readings"))}


@pytest.fixture
def job_env(cluster: Cluster, cifar_data: Path, tmp_path: Path, sif: Path) -> dict:
    """What a user sets before sbatch of a slurm/ script, pointed at this test's dirs.

    Cluster.sbatch submits as the test user, whose login PATH has the real apptainer,
    so every step runs `apptainer run --nv` of the SIF built by `make build-x86`; tmp_path
    is the user's. The site is "generic" (this machine has no Slingshot libraries to
    bind); GPUs are not requested (sbatch --gpus-per-node=0), so ddp-launch runs CPU
    workers, one a node (ONE_A_NODE). The preflight and the fabric gate are off (WITHOUT_CHECKS).
    """
    user_dir(tmp_path)
    return {**submit_env(sif, cifar_data), "DDP_RUN_DIR": str(tmp_path / "run"), "DDP_TRAIN_ARGS": TRAIN_ARGS,
            "DDP_MONITOR_INTERVAL": "1", **WITHOUT_CHECKS, **ONE_A_NODE}


# A job_env job runs one CPU worker a node: its test is about the job (a stop, a requeue, a lost or killed
# node, the run dir, the rendezvous), which one rank a node shows across nodes as well as two do, and each
# worker is one more process that imports torch from the image (3 to 4 CPU-s here, docs/testing.md). A test
# about a node's several ranks asks for two: the gate's node round, a straggler among a node's ranks, a stop
# that reaches every worker of a node. One thread a worker, as the twins' (twins.THREADS): the nodes share
# this machine's 2 cores, and ddp-launch leaves a lone worker torch's default of one thread a core, whose
# OpenMP threads spin between the small model's operators (a 2-node job array took twice the CPU-seconds).
ONE_A_NODE = {"DDP_LAUNCH_CPU_WORKERS": "1", "OMP_NUM_THREADS": "1"}
TWO_A_NODE = {"DDP_LAUNCH_CPU_WORKERS": "2"}


# The preflight (ddp-launch doctor on every node) is one more srun step through Apptainer at each start
# of a job, and the fabric gate seconds of the training's own ranks (a step of its own before a user's
# script), about 15 s together here. A job_env job runs without them:
# test_fabric_gate.py turns them on (WITH_CHECKS) and the twins run every script as it is; the other
# tests are about something else.
WITHOUT_CHECKS = {"DDP_PREFLIGHT": "0", "DDP_FABRIC_GATE": "0"}
WITH_CHECKS = {"DDP_PREFLIGHT": "1", "DDP_FABRIC_GATE": "1"}


# The trainer flags a twin's job gets after its script's own (which they follow and win over): one
# short epoch at a batch the test data holds (the scripts' layouts are what the twins test). The
# global batch divides by every twin job's world size (1, 2, 4, 6, 8 and 16 ranks).
TWIN_TRAIN_ARGS = ("--epochs", "1", "--limit-train", "256", "--batch-size", "96", "--width-scale", "0.125",
                   "--allow-unverified-data")


def twin_job_env(twin: twins.Twin, sif: Path, data: Path, run_dir: Path) -> dict:
    """What a user of twin's cluster has set before sbatch of a slurm/ script: the test user's login
    PATH, the site's modules (twins.job_env, with the CPU workers that stand in for the GPUs), the
    image, the data and a run dir of the test's; DDP_SITE, DDP_TRAIN_ARGS and the rest are the script's."""
    user_dir(run_dir.parent)
    return {"PATH": USER_PATH, "DDP_REPO": str(REPO), "DDP_IMAGE": str(sif), "DDP_DATA_DIR": str(data),
            "DDP_RUN_DIR": str(run_dir), "DDP_MONITOR_INTERVAL": "1", **twins.job_env(twin)}


@dataclass(frozen=True)
class TwinJob:
    """A slurm/ script as a twin's test submits it: the user's environment, and sbatch options beyond
    --output only where the test says why (or the README's quick start has them), the script's own
    arguments before the short-training flags."""

    script: str
    env: dict
    sbatch_extra: tuple = ()
    args: tuple = ()

    @property
    def run_dir(self) -> Path:
        return Path(self.env["DDP_RUN_DIR"])


def submit_twin_job_now(twin_cluster: Cluster, job: TwinJob) -> str:
    """job submitted as it is (only --output is given: the scripts write theirs into the checkout), with the
    short-training flags after the built-in trainer's arguments; a script of the user's (--script, --module)
    gets exactly its own. Its job id; its output is output_of(job, id)."""
    own = job.args[:1] in (("--script",), ("--module",))
    return twin_cluster.sbatch([f"--output={job.run_dir.parent}/%j.out", *job.sbatch_extra, job.script, *job.args,
                                *(() if own else TWIN_TRAIN_ARGS)], env=job.env)


def output_of(job: TwinJob, job_id: str) -> Path:
    return job.run_dir.parent / f"{job_id}.out"


def submit_twin_jobs(twin_cluster: Cluster, jobs: dict, timeout: float = 600,
                     on_submit: Callable[[str, TwinJob, str], None] | None = None) -> dict:
    """Each TwinJob of jobs submitted at once, in order (SLURM gives the first the first nodes), as it is,
    with the twin's facts answering its #SBATCH lines, then waited for: SLURM runs side by side those the
    nodes hold. {key: Job}. on_submit(key, job, job id): what the test does with a job while it runs."""
    started = time.monotonic()
    submitted = {}
    for key, job in jobs.items():
        submitted[key] = submit_twin_job_now(twin_cluster, job)
        if on_submit is not None:
            on_submit(key, job, submitted[key])
    ended = {}
    for key, job_id in submitted.items():
        ended[key] = twin_cluster.wait(job_id, timeout=max(1.0, timeout - (time.monotonic() - started)))
        _log(f"+ {jobs[key].script} (job {job_id}): {ended[key].state} within {time.monotonic() - started:.0f} s "
             "of the submission")
    return ended


def twin_script_job(twin: twins.Twin, script: str, env: dict) -> TwinJob:
    """script as twin's users submit it: the sbatch line of the README's quick start for twin's cluster,
    word for word (its variables, options and arguments; documented_blocks.QUICK_START_TWINS), where that
    line submits script; else the script alone."""
    line = documented_blocks.twin_quick_start(twin.name)
    if line is None or line.script != script:
        return TwinJob(script, env)
    return TwinJob(script, {**env, **line.env}, line.options, line.args)


def own_script_job(twin: twins.Twin, env: dict, run_dir: Path) -> TwinJob:
    """The README's own-script quick start for twin's cluster: its sbatch line word for word, with its run
    dir (documented_blocks.own_script_sbatch), run from the checkout as the job scripts require."""
    line = documented_blocks.own_script_sbatch(documented_blocks.own_script_job_script(twin.name))
    return TwinJob(line.script, {**env, "DDP_RUN_DIR": str(run_dir), **line.env}, line.options, line.args)


def quick_start_job(twin: twins.Twin, env: dict) -> TwinJob:
    """The README's quick start for twin's cluster, its sbatch line word for word."""
    line = documented_blocks.twin_quick_start(twin.name)
    assert line is not None, f"the README has no quick start for {twin.name}'s cluster (QUICK_START_TWINS)"
    return twin_script_job(twin, line.script, env)


# The key of the README's own-script quick start among a twin's jobs (run_twin_scripts, own_script=True).
OWN_SCRIPT = "own script"


def run_twin_scripts(twin_cluster: Cluster, twin: twins.Twin, scripts: tuple, image: Path, data: Path,
                     tmp_path_factory, extra_env: dict | None = None, own_script: bool = False,
                     on_submit: Callable[[str, TwinJob, str], None] | None = None) -> dict:
    """Each of scripts submitted at once on twin's cluster with a run dir of its own, as its users would
    (the quick start's script with its sbatch line), and run to its end: {script: (Job, run dir, output)}.
    extra_env: {script: what its user set besides}. own_script: the README's own-script quick start for
    twin's cluster too, submitted after them (the scripts keep the nodes they had), under OWN_SCRIPT."""
    jobs = {}
    for script in scripts:
        run_dir = user_dir(tmp_path_factory.mktemp(Path(script).stem)) / "run"
        env = {**twin_job_env(twin, image, data, run_dir), **(extra_env or {}).get(script, {})}
        jobs[script] = twin_script_job(twin, script, env)
    if own_script:
        run_dir = user_dir(tmp_path_factory.mktemp("own-script")) / "run"
        jobs[OWN_SCRIPT] = own_script_job(twin, twin_job_env(twin, image, data, run_dir), run_dir)
    ended = submit_twin_jobs(twin_cluster, jobs, on_submit=on_submit)
    return {script: (ended[script], jobs[script].run_dir, ended[script].output()) for script in jobs}


def submit_twin_job(twin_cluster: Cluster, script: str, env: dict, *sbatch_extra: str, timeout: float = 600) -> Job:
    return submit_twin_jobs(twin_cluster, {script: TwinJob(script, env, sbatch_extra)}, timeout)[script]


def submit_quick_start(twin_cluster: Cluster, twin: twins.Twin, env: dict, timeout: float = 600) -> Job:
    """The README's quick start for twin's cluster, submitted as it is written, and waited for."""
    job = quick_start_job(twin, env)
    return submit_twin_jobs(twin_cluster, {job.script: job}, timeout)[job.script]


def rank_logs(run_dir: Path) -> list[str]:
    """The per-rank logs of a task-mode job (slurm/lib/ddp.sh: <job>-<node>-rank<N>.out), sorted by rank."""
    names = [p.name for p in (run_dir / "logs").glob("*.out")]
    return sorted(names, key=lambda name: int(name.rsplit("rank", 1)[1].removesuffix(".out")))


def doctor_reports(run_dir: Path, job: Job) -> dict:
    """node -> {check name -> check} of the job's preflight (preflight/<job>/doctor-<node>.json)."""
    reports = {}
    for path in sorted((run_dir / "preflight" / job.job_id).glob("doctor-*.json")):
        checks = json.loads(path.read_text())["checks"]
        reports[path.stem.removeprefix("doctor-")] = {check["name"]: check for check in checks}
    return reports


def submit_env(sif: Path, data: Path) -> dict:
    """The part of job_env every job shares (also tests/e2e/soak.py's): the test user's PATH,
    the image, the generic site, the data, 2 CPU workers a node."""
    return {"PATH": USER_PATH, "DDP_REPO": str(REPO), "DDP_IMAGE": str(sif), "DDP_SITE": "generic",
            "DDP_DATA_DIR": str(data), "DDP_LAUNCH_CPU_WORKERS": "2"}


def metrics_records(run_dir: Path) -> list[dict]:
    """The trainer's metrics.jsonl records so far (none before its first line)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def epochs_done(run_dir: Path) -> int:
    return sum(1 for r in metrics_records(run_dir) if r["type"] == "epoch")


# The lines of a job's output an assertion's message needs: the job script's own (ddp:), every error and
# warning, and the recovery's. A CI log keeps the head and the tail of a long message and drops its middle,
# where a whole job's output puts them.
GIST_MARKS = ("ddp:", "error", "warning", "Recovered", "excluded", "Aborted", "terminate called")


def gist(output: str, limit: int = 6000) -> str:
    lines = [line for line in output.splitlines() if any(mark in line for mark in GIST_MARKS)]
    return "\n".join(lines)[-limit:]


def saved_epoch(run_dir: Path) -> int:
    """The epoch checkpoint.pt holds (0 before the first save); loading it proves it is whole."""
    import torch  # here, not at the top: most e2e workers never load a checkpoint (5 CPU-s an import)

    path = run_dir / "checkpoint.pt"
    if not path.exists():
        return 0
    return torch.load(path, map_location="cpu", weights_only=False)["progress"]["epoch"]


def checkpointed(epochs: int):
    """A wait_for_file predicate: whether `epochs` epochs of a run dir are trained and saved. The trainer
    writes an epoch's record before it saves that epoch (a collective, train.py), so a fault right after
    the record can land before the save: a test that expects a resume from epoch N waits for this, not
    for the record alone. Make it before the job starts: it imports torch now, not in the job's runway
    after epoch N (an import of a minute at a load of 50 let a 4-epoch job finish before the fault)."""
    import torch  # noqa: F401  (saved_epoch's import, paid here)

    return lambda run_dir: epochs_done(run_dir) >= epochs and saved_epoch(run_dir) >= epochs


def training_started(run_dir: Path) -> bool:
    """A wait_for_file predicate: whether the run's trainer has started training (its "run" record). Every rank
    has installed its stop handlers by then (train.run: before the process group, which the record follows),
    and the job's batch shell its trap (slurm/lib/ddp.sh, before the first step): a stop sent now is acted on."""
    return any(r["type"] == "run" for r in metrics_records(run_dir))


def sbatch_args(tmp_path: Path, *extra: str) -> list[str]:
    """Overrides a site's sbatch lines need on the test cluster: its partition, no GPUs."""
    return ["--partition=e2e", "--gpus-per-node=0", f"--output={tmp_path}/%j.out", *extra]
