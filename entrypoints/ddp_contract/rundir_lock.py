"""One job per run directory: <run-dir>/.ddp-run.lock names its owner (job, host, pid).

Two jobs writing one checkpoint.pt and one metrics.jsonl would interleave both. The
trainer's rank 0 creates the lock file with O_CREAT|O_EXCL and refreshes its mtime every
HEARTBEAT_S while it runs; the job scripts read it first (`python3 -m ddp_contract
run-dir-lock DIR`), so a second job stops before its GPU sampler or its logs touch the dir.

Why a file created with O_EXCL and not flock(2)/fcntl(2): run dirs live on NFS, Lustre and
GPFS. flock on NFS is emulated with byte-range locks and Lustre grants it across clients
only when mounted with `-o flock` (Lustre manual, "Mount options": localflock is node-local,
noflock fails it); and a lock held by a node that died stays held until the server's lease
expires. O_EXCL creation is atomic on NFSv3+ (open(2), "O_EXCL") and on Lustre and GPFS,
and the file says who holds it, so the refusal can name the job.

A lock is not in the way when (decide(), in this order):
- it names this job (DDP_JOB_ID, which ddp-launch sets from the scheduler's own variables,
  ddp_launch/job_identity.py, and the job scripts from SLURM's job id): a requeue, a restart of
  the workers, or a new container of a pod of the same job, whose old one is gone: Kubernetes
  restarts a container after it exited, in the same pod, which keeps its name (the host name here)
  and starts PID 1 again, so the old owner's pid may well be alive here as another process;
- it names this host, the same PID namespace, and a pid that is gone: a local run that was killed;
- its mtime is STALE_AFTER_S older than the file system's clock (a new file's mtime, so no
  clock skew between nodes): its owner stopped refreshing it, e.g. a node that died.
A pid says something only in the PID namespace it was taken in: a container of its own (a pod's,
`apptainer run --pid`) numbers its processes from 1, on the same host name. The owner names its
namespace by the boot and the start of that namespace's PID 1 (pid_space(): the kernel's boot_id,
proc(5) /proc/sys/kernel/random/boot_id, and field 22 of /proc/1/stat, "the time the process
started after system boot"); a lock from another namespace on this host is judged by job and age
alone, never by a pid that may be another process's here.
Taking over a stale lock is a rename, not an O_EXCL create: two jobs that both find it stale
at the same instant could both take it (a narrow race this file does not close).
Python 3.6, standard library: the job scripts run it with the node's python3.
"""

import json
import os
import socket
import sys
import threading
import time
from typing import Mapping, NamedTuple, Optional

from ddp_contract import JOB_ID_VAR

LOCK_NAME = ".ddp-run.lock"
HEARTBEAT_S = 20.0
STALE_AFTER_S = 120.0  # six missed heartbeats


class Owner(NamedTuple):
    job: str  # "" outside a scheduler
    host: str
    pid: int
    pid_space: str = ""  # the PID namespace the pid is in ("" unknown: an older lock, /proc unreadable)


class LockHeld(Exception):
    """The run dir belongs to another live job; the message is the one line to print."""


def pid_space(proc: str = "/proc") -> str:
    """This PID namespace, as "<boot id>/<start of its PID 1 in clock ticks after boot>"; "" when
    /proc does not say (a hidepid mount, no /proc)."""
    try:
        with open(os.path.join(proc, "sys/kernel/random/boot_id")) as handle:
            boot = handle.read().strip()
        with open(os.path.join(proc, "1/stat")) as handle:
            fields = handle.read().rpartition(")")[2].split()  # the command name may hold spaces
        return "{}/{}".format(boot, fields[19]) if boot and len(fields) > 19 else ""  # field 22 of stat
    except OSError:
        return ""


def owner_here(env: Mapping[str, str], pid: Optional[int] = None, proc: str = "/proc") -> Owner:
    return Owner(env.get(JOB_ID_VAR, "").strip(), socket.gethostname(), os.getpid() if pid is None else pid,
                 pid_space(proc))


def parse_owner(text: str) -> Optional[Owner]:
    try:
        data = json.loads(text)
        return Owner(str(data["job"]), str(data["host"]), int(data["pid"]), str(data.get("pid_space") or ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # half-written or foreign: judged by its age alone


def same_pid_space(held_by: Owner, me: Owner) -> bool:
    """Whether held_by's pid can be looked up here: this host, and this PID namespace where both
    say which (a lock written before they did is taken to be from the host's, as it was)."""
    if held_by.host != me.host:
        return False
    return not (held_by.pid_space and me.pid_space) or held_by.pid_space == me.pid_space


def decide(held_by: Optional[Owner], age_s: float, me: Owner, pid_alive: bool) -> Optional[str]:
    """None when `me` may take the run dir; else why not, for the refusal."""
    if held_by is None:
        return None if age_s > STALE_AFTER_S else "a lock file that is being written"
    if held_by.job and held_by.job == me.job:
        return None
    if same_pid_space(held_by, me) and not pid_alive:
        return None
    if age_s > STALE_AFTER_S:
        return None
    job = "job {}".format(held_by.job) if held_by.job else "a run"
    return "{} on {} (pid {}, alive {:.0f} s ago)".format(job, held_by.host, held_by.pid, max(age_s, 0.0))


def refusal(run_dir: str, holder: str) -> str:
    lock = os.path.join(run_dir, LOCK_NAME)
    return ("--run-dir {} is in use by {}: give this job another run dir (DDP_RUN_DIR / --run-dir) or wait "
            "for that one to end; a lock whose owner died goes stale after {:.0f} s ({})"
            .format(run_dir, holder, STALE_AFTER_S, lock))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fs_now(run_dir: str) -> float:
    """The file system's clock: the mtime of a file created now (nodes' clocks may differ)."""
    probe = os.path.join(run_dir, ".ddp-run.clock.{}.{}".format(socket.gethostname(), os.getpid()))
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        return os.fstat(fd).st_mtime
    finally:
        os.close(fd)
        os.unlink(probe)


def _read(path: str):
    """(owner or None, mtime), or None when there is no lock."""
    try:
        with open(path) as handle:
            text = handle.read()
            mtime = os.fstat(handle.fileno()).st_mtime
    except FileNotFoundError:
        return None
    return parse_owner(text), mtime


def check(run_dir: str, me: Owner) -> None:
    """Raise LockHeld when another live job holds run_dir; takes nothing (the job scripts' check)."""
    found = _read(os.path.join(run_dir, LOCK_NAME))
    if found is None:
        return
    held_by, mtime = found
    why = decide(held_by, _fs_now(run_dir) - mtime, me,
                 _pid_alive(held_by.pid) if held_by is not None and same_pid_space(held_by, me) else False)
    if why is not None:
        raise LockHeld(refusal(run_dir, why))


class RunDirLock:
    """The run dir's lock, held by this process: acquire(), a heartbeat thread, release()."""

    def __init__(self, run_dir: str, me: Owner):
        self.run_dir, self.me = run_dir, me
        self.path = os.path.join(run_dir, LOCK_NAME)
        self._stop = threading.Event()
        self._thread = None  # type: Optional[threading.Thread]

    @classmethod
    def taken(cls, run_dir, env):
        # type: (str, Mapping[str, str]) -> RunDirLock
        """The lock of run_dir taken by this process (owner_here), or LockHeld; OSError: unwritable."""
        lock = cls(run_dir, owner_here(env))
        lock.acquire()
        return lock

    def _content(self) -> bytes:
        return json.dumps(dict(self.me._asdict(), since=round(time.time(), 3))).encode()

    def acquire(self) -> None:
        """Take the lock or raise LockHeld; OSError (an unwritable dir) is the caller's to say."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            check(self.run_dir, self.me)  # LockHeld, or it is ours to take over
            staging = "{}.{}.{}".format(self.path, self.me.host, self.me.pid)
            with open(staging, "wb") as handle:
                handle.write(self._content())
            os.replace(staging, self.path)
        else:
            try:
                os.write(fd, self._content())
            finally:
                os.close(fd)
        self._thread = threading.Thread(target=self._beat, name="run-dir-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass  # a full or vanished dir: the run's own writes will say so

    def release(self) -> None:
        self._stop.set()
        found = _read(self.path)
        if found is not None and found[0] == self.me:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def main(argv) -> int:
    """`python3 -m ddp_contract run-dir-lock DIR`: exit 2 with one line when another job holds DIR."""
    run_dir = argv[0]
    if not os.path.isdir(run_dir):
        return 0
    try:
        check(run_dir, owner_here(os.environ))
    except LockHeld as held:
        print("ddp: error: {}".format(held), file=sys.stderr)
        return 2
    return 0
