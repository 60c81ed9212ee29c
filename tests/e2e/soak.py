"""The soak: N short 2-node jobs back to back on the namespace cluster, under load, each with a
fault drawn from a seeded RNG, and the books kept on what was lost.

Usage (root; `make soak N=50 SEED=1`):
  PYTHONPATH=tests python tests/e2e/soak.py --jobs N --seed S [--load K] [--minutes M]
The cluster, the images and the data are the e2e tests' (conftest.start_cluster, build_images,
stage_data): the real Apptainer in the cluster's Debian root, jobs submitted by its test user.
Faults: none; USR2 (to the batch shell, as SLURM sends it at the time limit for the job scripts'
--signal=B:USR2@120) and TERM (to every process of the job's steps; that job runs unsquashed), each
a stop: checkpoint, exit 75, the job script requeues, the job resumes at the step it stopped and
completes; SIGKILL of one worker or of a launcher, each a crash: exit 1 or 137, FAILED; a lost node
(a whole node killed, slurmd and its processes, or its network dropped), a bad node: the roll call
names it, the job script requeues the job without it (exit 76) and the job resumes from the last
checkpoint and completes, with one restart (SLURM's own NODE_FAIL requeue, where it saw the node go
first, ends the same way); a full disk under the run dir (its own small file system): one line, exit 2, FAILED, the checkpoint
intact, and a new job on the same run dir resumes from it once space is freed; kill-node with a spare
(a 2-node job with DDP_SPARE_NODES=1 on 3 nodes): the spare takes the killed node's place inside the
job, which resumes from the checkpoint and completes without a requeue. For every job: the
SLURM state and exit code match the fault, the
checkpoint loads and holds every epoch before the fault, no job process is left on any node, every
line of metrics.jsonl is whole JSON, a requeued job resumes at the stopped step.
Prints one line of totals and writes it to docs/reliability.md. The same seed draws the same faults.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# A script, outside pytest: tests/ (the shared fakes, which pyproject.toml's pytest pythonpath gives
# the tests) comes from PYTHONPATH, as `make soak` sets it; this script's own directory is sys.path[0].
import apptainer_root
import conftest  # the e2e harness: cluster, images, data, job environment

REPO = conftest.REPO
FAULTS = ("none", "USR2", "TERM", "kill-worker", "kill-launcher", "kill-node", "net-drop", "disk-full",
          "kill-node-spare")
# How each stop is sent (scancel(1)) and what its job's environment needs.
# USR2 goes to the batch shell alone (--batch), as SLURM sends --signal=B:USR2@120 at the time
# limit: ddp.sh's trap passes it on through <run-dir>/.ddp-stop-request.
# TERM (preemption) goes to every process of the job's steps, squashfuse_ll among them, which
# serves the image under unprivileged Apptainer: TERM unmounts it and the workers die of SIGBUS
# and the job fails (tests/e2e/test_faults.py shows it). APPTAINER_UNSQUASH=1 (`apptainer
# run --unsquash`: the SIF unpacked to a temporary sandbox) leaves nothing to kill. The process
# kills keep squashfuse, the default.
STOPS = {"USR2": ({}, ["--batch", "--signal=USR2"]), "TERM": ({"APPTAINER_UNSQUASH": "1"}, ["--signal=TERM"])}
# The preflight (doctor on every node) and the fabric gate have e2e tests of their own and took a
# minute of every run here; without them a job with a stop and a resume takes about 1.5 minutes
# instead of 3, and N = 50 fits in an afternoon. Faults are injected while the workers train.
SKIP_CHECKS = {"DDP_PREFLIGHT": "0", "DDP_FABRIC_GATE": "0"}
RUN = ("--epochs 6 --batch-size 64 --width-scale 0.25 --allow-unverified-data --checkpoint-every 1 "
       "--dist-timeout-s 30")


@dataclass
class Books:
    jobs: int = 0
    faults: collections.Counter = field(default_factory=collections.Counter)
    lost_checkpoints: int = 0
    orphans: int = 0
    wrong_states: int = 0
    truncated_metrics: int = 0
    bad_resumes: int = 0
    problems: list = field(default_factory=list)

    def line(self, seed: int) -> str:
        faults = ", ".join(f"{kind} {self.faults[kind]}" for kind in FAULTS if self.faults[kind])
        return (f"soak seed {seed}: {self.jobs} jobs (faults: {faults}); lost or corrupt checkpoints "
                f"{self.lost_checkpoints}, orphaned processes {self.orphans}, wrong states {self.wrong_states}, "
                f"truncated metrics {self.truncated_metrics}, wrong resumes {self.bad_resumes}")


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def metrics_whole(run_dir: Path) -> bool:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return True
    text = path.read_text()
    try:
        [json.loads(line) for line in text.splitlines()]
    except ValueError:
        return False
    return text == "" or text.endswith("\n")


def epochs_done(run_dir: Path) -> int:
    try:
        return sum(1 for r in records(run_dir) if r["type"] == "epoch")
    except ValueError:  # a line being appended this instant
        return 0


def saved_epoch(run_dir: Path) -> int | None:
    """The checkpoint's epoch; None when it is missing or does not load (lost or corrupt)."""
    code = ("import sys, torch; s = torch.load(sys.argv[1], map_location='cpu', weights_only=False); "
            "print(s['progress']['epoch'])")
    done = subprocess.run([sys.executable, "-c", code, str(run_dir / "checkpoint.pt")], capture_output=True,
                          text=True, timeout=120)
    return int(done.stdout) if done.returncode == 0 else None


def checkpoint_kept(books: Books, problems: list, run_dir: Path, before: int) -> int | None:
    """The checkpoint's epoch after the fault; lost when it is gone, corrupt, or older than the
    epoch before the last one finished before the fault (a save may have been in flight)."""
    saved = saved_epoch(run_dir)
    if before >= 2 and (saved is None or saved < before - 1):
        books.lost_checkpoints += 1
        problems.append(f"checkpoint epoch {saved} after {before} epochs done before the fault")
    return saved


def pids_on(cluster, node: str, want) -> list[str]:
    pids = subprocess.run(["ip", "netns", "pids", cluster.netns(node)], capture_output=True, text=True).stdout
    hits = []
    for pid in pids.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if want(cmdline):
            hits.append(pid)
    return hits


def is_worker(cmdline) -> bool:
    return b"ddp_launch.worker" in cmdline and b"ddp_launch.agent" not in cmdline


def is_agent(cmdline) -> bool:
    return b"ddp_launch.agent" in cmdline


NODE_FAULTS = ("kill-node", "net-drop")


class SmallDisk:
    """A 64 MiB ext4 on a loop device mounted over the run dir, here and in every node's mount
    namespace (the nodes' are private: cluster.sh unshares them with --propagation private). One
    block device mounted three times is one file system, as a shared one is, so this machine reads
    what the nodes write. The same setup as the e2e test
    test_a_run_dir_whose_disk_fills_mid_run_stops_in_one_line_and_resumes_once_space_is_freed."""

    def __init__(self, cluster, run_dir: Path, image: Path):
        self.cluster, self.run_dir, self.image, self.loop = cluster, run_dir, image, None

    def __enter__(self) -> "SmallDisk":
        subprocess.run(["truncate", "-s", "64M", str(self.image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)], check=True)  # -m 0: no root reserve
        self.loop = subprocess.run(["losetup", "--find", "--show", str(self.image)], check=True,
                                   capture_output=True, text=True).stdout.strip()
        self.run_dir.mkdir()
        subprocess.run(["mount", self.loop, str(self.run_dir)], check=True)
        for node in self.cluster.node_names:
            mounted = self.cluster.node_exec(node, ["mount", self.loop, str(self.run_dir)], timeout=60)
            if mounted.returncode != 0:
                raise RuntimeError(f"mount on {node} failed: {mounted.stderr.strip()[-200:]}")
        # The new file system's root is root's: the jobs' user must write there.
        os.chown(self.run_dir, apptainer_root.TEST_UID, apptainer_root.TEST_UID)
        return self

    def between_saves(self) -> bool:
        """No checkpoint write in flight (checkpoint.save_atomic: a .tmp, then renames): epoch 2's
        save left checkpoint.prev.pt, and epoch 3's comes an epoch later."""
        names = os.listdir(self.run_dir)
        return "checkpoint.prev.pt" in names and not any(name.endswith(".tmp") for name in names)

    def fill(self, leave_kib: int = 2048) -> None:
        """All but leave_kib taken: the logs' lines fit, the next checkpoint (8 MiB) does not."""
        stat = os.statvfs(self.run_dir)
        free_kib = stat.f_bavail * stat.f_frsize // 1024
        subprocess.run(["fallocate", "-l", f"{max(free_kib - leave_kib, 0)}k", str(self.run_dir / "filler")],
                       check=True)

    def free(self) -> None:
        (self.run_dir / "filler").unlink()

    def __exit__(self, *_) -> None:
        for node in self.cluster.node_names:
            self.cluster.node_exec(node, ["umount", "-l", str(self.run_dir)], timeout=60)
        subprocess.run(["umount", "-l", str(self.run_dir)])
        subprocess.run(["losetup", "-d", self.loop])
        self.image.unlink(missing_ok=True)


def inject(cluster, kind: str, job_id: str, nodes: list[str], rng: random.Random) -> str:
    """The fault, on one of the job's nodes (the cluster has spares); returns that node."""
    node = rng.choice(nodes)
    if kind in STOPS:
        cluster.run(["scancel", *STOPS[kind][1], job_id], timeout=30)
    elif kind in ("kill-worker", "kill-launcher"):
        pids = pids_on(cluster, node, is_worker if kind == "kill-worker" else is_agent)
        if not pids:  # a fault not injected is the harness's failure, not a job that survived it
            raise RuntimeError(f"no {kind.removeprefix('kill-')} process on {node} to kill")
        subprocess.run(["kill", "-KILL", rng.choice(sorted(pids))], check=True)
    elif kind in NODE_FAULTS:
        node = nodes[1]  # the first node runs the batch script
        if kind == "kill-node":
            crashed = cluster.cluster_sh(["crash", node], timeout=30)
            if crashed.returncode != 0:
                raise RuntimeError(f"cluster.sh crash {node} failed: {crashed.stderr.strip()[-200:]}")
        else:
            subprocess.run(["ip", "-n", cluster.netns(node), "link", "set", "eth0", "down"], check=True)
    return node


def revive(cluster, node: str) -> None:
    revived = cluster.cluster_sh(["revive", node], timeout=180)
    if revived.returncode != 0:
        raise RuntimeError(f"cluster.sh revive {node} failed: {revived.stderr.strip()[-200:]}")


def wait_terminal(cluster, job_id: str, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = cluster.job(job_id)
        if job.state in conftest.TERMINAL_STATES:
            return job
        time.sleep(1)
    cluster.run(["scancel", job_id], timeout=30)
    return cluster.job(job_id)


def submit_job(cluster, env: dict, out: Path, *sbatch_extra: str) -> str:
    """olivia-multinode.sh submitted with env, its output in out: the job id."""
    return cluster.sbatch(["--partition=e2e", "--gpus-per-node=0", *sbatch_extra, f"--output={out}/%j.out",
                           "slurm/olivia-multinode.sh"], env=env)


def start_training(cluster, env: dict, out: Path, *sbatch_extra: str, ready=lambda: True) -> tuple[str, int]:
    """submit_job, then waited for until two epochs are done and ready() holds (or the job ended, or
    300 s passed): its job id and the epochs done then."""
    job_id = submit_job(cluster, env, out, *sbatch_extra)
    run_dir = Path(env["DDP_RUN_DIR"])
    deadline = time.monotonic() + 300
    while not (epochs_done(run_dir) >= 2 and ready()) and time.monotonic() < deadline and \
            cluster.job(job_id).state not in conftest.TERMINAL_STATES:
        time.sleep(0.5)
    return job_id, epochs_done(run_dir)


def one_job(cluster, books: Books, index: int, kind: str, rng: random.Random, base_env: dict, out: Path) -> None:
    run_dir = out / f"run-{index:03d}"
    if kind == "disk-full":
        with SmallDisk(cluster, run_dir, out / f"disk-{index:03d}.img") as disk:
            return full_disk_job(cluster, books, index, disk, base_env, out)
    if kind == "kill-node-spare":
        return spare_job(cluster, books, index, rng, base_env, out)
    env = {**base_env, **STOPS.get(kind, ({}, []))[0], **SKIP_CHECKS, "DDP_RUN_DIR": str(run_dir),
           "DDP_TRAIN_ARGS": RUN,
           "DDP_MONITOR_INTERVAL": "0"}
    job_id, before = start_training(cluster, env, out)
    nodes = cluster.job_nodes(cluster.job(job_id))
    time.sleep(rng.uniform(0, 2))  # anywhere in the epoch
    saved_before = None
    if kind in NODE_FAULTS:
        node = inject(cluster, kind, job_id, nodes, rng)
        try:
            # The job script requeues the job without the lost node (exit 76; or SLURM does, as NODE_FAIL,
            # where it saw the node go first): Restarts goes to 1 before the next run starts.
            deadline = time.monotonic() + 300
            while cluster.job(job_id).fields.get("Restarts") == "0" and time.monotonic() < deadline and \
                    cluster.job(job_id).state not in conftest.TERMINAL_STATES:
                time.sleep(1)
            saved_before = saved_epoch(run_dir)  # what the requeued run must resume from
        finally:
            revive(cluster, node)
    elif kind != "none":
        inject(cluster, kind, job_id, nodes, rng)
    job = wait_terminal(cluster, job_id, 600)
    books.jobs += 1
    books.faults[kind] += 1
    problems = []

    outcome = (job.state, job.exit_code, job.fields.get("Restarts"))
    if kind == "none":
        right = outcome == ("COMPLETED", "0:0", "0")
    elif kind in STOPS or kind in NODE_FAULTS:  # requeued by the job script (75, or 76 without the node), resumed
        right = outcome == ("COMPLETED", "0:0", "1")
        if kind in NODE_FAULTS:  # and without the lost node
            outcome += (f"ExcNodeList={job.fields.get('ExcNodeList')}",)
            right = right and job.fields.get("ExcNodeList") == node
    else:  # a crash: FAILED with the launcher's code, never requeued by the job script
        right = job.state == "FAILED" and job.exit_code != "0:0" and outcome[2] == "0"
    if not right:
        books.wrong_states += 1
        problems.append(f"state, exit, restarts {outcome} do not match {kind}")

    checkpoint_kept(books, problems, run_dir, before)

    if not metrics_whole(run_dir):
        books.truncated_metrics += 1
        problems.append("metrics.jsonl has a partial line")
    elif kind in STOPS or kind in NODE_FAULTS:
        recs = records(run_dir)
        stopped = [(r["epochs_completed"], r["step"]) for r in recs if r["type"] == "stopped"]
        starts = [r for r in recs if r["type"] == "run"]
        if kind in NODE_FAULTS:  # no stop record: it resumes at the last checkpoint, an epoch's end
            stopped = [(saved_before, 0)]
        if not stopped or len(starts) < 2 or \
                (starts[1]["resumed_from_epoch"], starts[1]["resumed_from_step"]) != stopped[0]:
            books.bad_resumes += 1
            problems.append(f"resume {[(s['resumed_from_epoch'], s['resumed_from_step']) for s in starts]} "
                            f"after stop {stopped}")

    settle(cluster, books, index, kind, job, problems)


def settle(cluster, books: Books, index: int, kind: str, job, problems: list) -> None:
    """No job process left on any node; the job's line; its problems kept for the report."""
    left = cluster.settled(90)  # KillWait and srun --wait bound what SLURM leaves running
    if left:
        books.orphans += len(left)
        problems.append(f"left behind: {left}")
        for entry in left:
            subprocess.run(["kill", "-KILL", entry.split(":")[1]])
    status = "ok" if not problems else "PROBLEM: " + "; ".join(problems)
    print(f"soak job {index + 1}: {kind}: job {job.job_id} {job.state} {job.exit_code}: {status}", flush=True)
    if problems:
        books.problems.append(f"job {index + 1} ({kind}, {job.job_id}): {'; '.join(problems)}")


def spare_job(cluster, books: Books, index: int, rng: random.Random, base_env: dict, out: Path) -> None:
    """A 2-node job with one spare (3 nodes) whose second training node dies mid-run (cluster.sh crash):
    the roll call names it, the spare trains in its place from the last checkpoint, the job completes
    without a requeue, with one "recovery" record (slurm/lib/ddp.sh, DDP_SPARE_NODES)."""
    run_dir = out / f"run-{index:03d}"
    env = {**base_env, **SKIP_CHECKS, "DDP_RUN_DIR": str(run_dir), "DDP_TRAIN_ARGS": RUN, "DDP_MONITOR_INTERVAL": "0",
           "DDP_SPARE_NODES": "1"}
    job_id, before = start_training(cluster, env, out, "--nodes=3")
    node = cluster.job_nodes(cluster.job(job_id))[1]  # a training node; the first runs the batch script
    time.sleep(rng.uniform(0, 2))
    crashed = cluster.cluster_sh(["crash", node], timeout=30)
    if crashed.returncode != 0:
        raise RuntimeError(f"cluster.sh crash {node} failed: {crashed.stderr.strip()[-200:]}")
    try:
        report = run_dir / "roll-call.json"
        deadline = time.monotonic() + 120
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        saved_before = saved_epoch(run_dir)  # the old step's ranks have stopped: what the spare resumes
        job = wait_terminal(cluster, job_id, 600)
    finally:
        revive(cluster, node)
    books.jobs += 1
    books.faults["kill-node-spare"] += 1
    problems = []
    outcome = (job.state, job.exit_code, job.fields.get("Restarts"))
    recoveries = [r for r in records(run_dir) if r["type"] == "recovery"] if metrics_whole(run_dir) else []
    if outcome != ("COMPLETED", "0:0", "0") or len(recoveries) != 1:
        books.wrong_states += 1
        problems.append(f"state, exit, restarts {outcome} and {len(recoveries)} recovery record(s) do not match a "
                        f"spare in {node}'s place")
    checkpoint_kept(books, problems, run_dir, before)
    if not metrics_whole(run_dir):
        books.truncated_metrics += 1
        problems.append("metrics.jsonl has a partial line")
    else:
        starts = [r for r in records(run_dir) if r["type"] == "run"]
        if len(starts) != 2 or starts[1]["resumed_from_epoch"] != saved_before:
            books.bad_resumes += 1
            problems.append(f"resume {[s['resumed_from_epoch'] for s in starts]} after a checkpoint of epoch "
                            f"{saved_before}")
    settle(cluster, books, index, "kill-node-spare", job, problems)


def full_disk_job(cluster, books: Books, index: int, disk: SmallDisk, base_env: dict, out: Path) -> None:
    """Filled between two saves: the job stops in one line with exit 2 (a user's problem, never
    requeued), the checkpoint intact; once space is freed a new job on the run dir resumes from it."""
    run_dir = disk.run_dir
    env = {**base_env, "DDP_RUN_DIR": str(run_dir), "DDP_TRAIN_ARGS": RUN, **SKIP_CHECKS, "DDP_MONITOR_INTERVAL": "0"}
    job_id, before = start_training(cluster, env, out, ready=disk.between_saves)
    disk.fill()
    job = wait_terminal(cluster, job_id, 600)
    books.jobs += 1
    books.faults["disk-full"] += 1
    problems = []
    output = job.output()
    errors = [line for line in output.splitlines() if "ddp-train: error:" in line]
    outcome = (job.state, job.exit_code, job.fields.get("Restarts"))
    if outcome != ("FAILED", "2:0", "0") or len(errors) != 1 or "No space left on device" not in errors[0] \
            or "Traceback" in output:
        books.wrong_states += 1
        problems.append(f"state, exit, restarts {outcome}, error lines {errors[:2]} do not match a full disk")
    saved = checkpoint_kept(books, problems, run_dir, before)
    disk.free()
    again = wait_terminal(cluster, submit_job(cluster, env, out), 600)
    if (again.state, again.exit_code) != ("COMPLETED", "0:0"):
        books.wrong_states += 1
        problems.append(f"the job after space was freed ended {again.state} {again.exit_code}")
    if not metrics_whole(run_dir):
        books.truncated_metrics += 1
        problems.append("metrics.jsonl has a partial line")
    else:
        starts = [r for r in records(run_dir) if r["type"] == "run"]
        if saved is not None and (len(starts) < 2 or starts[-1]["resumed_from_epoch"] != saved):
            books.bad_resumes += 1
            problems.append(f"resume {[s['resumed_from_epoch'] for s in starts]} after a checkpoint of epoch {saved}")
    settle(cluster, books, index, "disk-full", job, problems)


def start_load(count: int) -> list[subprocess.Popen]:
    """Busy loops beside the jobs: the machine under load (stopped by PID at the end)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def write_report(line: str, books: Books, args) -> None:
    report = REPO / "docs" / "reliability.md"
    text = report.read_text() if report.exists() else ""
    marker = "## Soak results"
    head = text.split(marker)[0] if marker in text else text
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [marker, "", f"Last run: {stamp}, `make soak N={args.jobs} SEED={args.seed}` with {args.load} "
            f"busy loop(s) beside the 2-node namespace cluster.", "", "```text", line, "```", ""]
    if books.problems:
        body += ["Problems:", ""] + [f"- {p}" for p in books.problems] + [""]
    report.write_text(head.rstrip("\n") + "\n\n" + "\n".join(body) if head.strip() else "\n".join(body))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--load", type=int, default=1, help="busy loops beside the jobs")
    parser.add_argument("--no-report", action="store_true", help="do not write docs/reliability.md")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"the kinds to draw from, comma-separated (default: all of {','.join(FAULTS)})")
    parser.add_argument("--minutes", type=float, default=0,
                        help="start no job after this many minutes (0: no limit); the totals say so")
    args = parser.parse_args(argv)
    # A soak stopped with kill or Ctrl-C (also from a nohup'ed shell, which ignores SIGINT) still
    # takes its cluster down: the `finally` below runs on SystemExit and KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    print(f"soak: seed {args.seed}, {args.jobs} jobs (repeat with --seed {args.seed})", flush=True)
    reason = conftest._skip_reason() or apptainer_root.missing_tools()
    if reason:
        print(f"soak: cannot run: {reason}", file=sys.stderr)
        return 2
    drawn_from = tuple(args.faults.split(","))
    unknown = sorted(set(drawn_from) - set(FAULTS))
    if unknown:
        parser.error(f"--faults: unknown kind(s) {', '.join(unknown)}; choose from {','.join(FAULTS)}")
    rng = random.Random(args.seed)
    kinds = [rng.choice(drawn_from) for _ in range(args.jobs)]
    out = Path(tempfile.mkdtemp(prefix="ddp-soak-"))
    print(f"soak: run dirs and job output in {out}", flush=True)
    data = conftest.stage_data(out / "data")
    conftest.user_dir(out)  # the jobs' user writes the run dirs and SLURM output there
    conftest._log = lambda text: None  # one line per job here, not every command's output
    try:
        cluster = conftest.start_cluster()
    except conftest.SetupError as error:
        print(f"soak: {error}", file=sys.stderr)
        return 1
    try:
        sifs = conftest.build_images(cluster)
    except conftest.SetupError as error:
        conftest.stop_cluster(cluster.env)
        print(f"soak: {error}", file=sys.stderr)
        return 1
    base_env = conftest.submit_env(sifs.x86, data)
    load = start_load(args.load)
    books = Books()
    started = time.monotonic()
    try:
        for index, kind in enumerate(kinds):
            if args.minutes and time.monotonic() - started > args.minutes * 60:
                books.problems.append(f"stopped after {index} of {args.jobs} jobs: --minutes {args.minutes:g}")
                break
            try:
                one_job(cluster, books, index, kind, rng, base_env, out)
            except Exception as error:  # noqa: BLE001 - a harness failure is counted, not fatal
                books.jobs += 1
                books.faults[kind] += 1
                books.wrong_states += 1
                books.problems.append(f"job {index + 1} ({kind}): harness: {error!r}"[:300])
                print(f"soak job {index + 1}: {kind}: harness error {error!r}"[:300], flush=True)
                cluster.cancel_all()
            if not args.no_report:  # so far, in case the run is cut short
                write_report(books.line(args.seed) + " (in progress)", books, args)
    finally:
        for busy in load:
            busy.kill()
            busy.wait()
        conftest.stop_cluster(cluster.env)
    line = books.line(args.seed)
    print(line, flush=True)
    if not args.no_report:
        write_report(line, books, args)
    return 0 if not books.problems and books.jobs == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
