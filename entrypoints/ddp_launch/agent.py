"""torchrun with our exit codes and stop signals: what ddp-launch execs in torchrun modes.

The launcher exits with the workers' own code (2 usage error, 75 stopped after a
checkpoint, 1 crash) in one line, never torchrun's ChildFailedError report; only a
crash is restarted; USR1, USR2 and TERM reach the workers so they checkpoint.

This module imports torch: it runs only after the exec, never in the launcher.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from ddp_contract import EXIT_BAD_NODE, EXIT_REQUEUE, EXIT_USAGE, RENDEZVOUS_STARTED_VAR, launcher_reports
from ddp_contract import free_bytes as contract_free_bytes
from ddp_contract.heartbeat import HEARTBEAT_DIR_VAR
from ddp_launch.watchdog import Watchdog, heartbeat_directory
from ddp_launch.worker import PARENT_PID_VARIABLE

# The stop requests the trainer turns into "checkpoint, then exit 75". torchrun
# itself knows only TERM/INT/HUP/QUIT, and answers TERM by raising in the agent
# (a SignalException traceback, exit 1) while it stops the workers, so the
# checkpoint the trainer writes is reported as a failure. Forwarded instead:
# - USR1/USR2: SLURM's `--signal=USR2@T` before the time limit, and `scancel
#   --signal=USR2` (sbatch(1), scancel(1)); their default action would kill the agent
#   and orphan the workers. (Our scripts ask for `B:USR2@T`, which reaches the batch
#   shell alone and comes to the trainer as a file: slurm/lib/ddp.sh, ddp::request_stop.)
# - TERM: scancel and preemption send it to every process of the step, then KILL
#   after KillWait (scancel(1), slurm.conf(5) KillWait, default 30 s); Kubernetes
#   sends it to PID 1 of the container only, then KILL after
#   terminationGracePeriodSeconds (kubernetes.io, "Pod Lifecycle: Termination of
#   Pods", default 30 s). Forwarding covers both: workers that already got it
#   from SLURM get it twice, which only sets their stop flag again.
FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
# torchrun's default --signals-to-handle without SIGTERM, which is forwarded above.
TORCHRUN_HANDLED_SIGNALS = ("SIGINT", "SIGHUP", "SIGQUIT")

EXIT_CRASH = 1
EXIT_RENDEZVOUS = 1  # what torchrun itself returns for a failed rendezvous
# A restart cannot fix a usage error, a stop request must stay stopped, and a bad node
# (the fabric gate's verdict) is fixed only by running elsewhere.
NOT_RETRIED = frozenset({EXIT_USAGE, EXIT_REQUEUE, EXIT_BAD_NODE})



def child_pids(parent: int, proc: str = "/proc") -> list[int]:
    """PIDs whose parent is `parent`, read from /proc (no psutil in the image)."""
    children = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat")) as stat_file:
                stat = stat_file.read()
        except OSError:
            continue  # exited while we looked
        # The command name (field 2) may hold spaces and ')': split after its last ')'.
        state_and_rest = stat[stat.rindex(")") + 2:].split()
        if int(state_and_rest[1]) == parent:
            children.append(int(entry))
    return children


def own_exit_codes(codes: Sequence[int]) -> list[int]:
    """The codes of workers that ended on their own, without those torchrun stopped.

    Once one worker fails, torchrun sends the others TERM and lists them among the
    failures "for bookkeeping" (exit code -15), so a usage error on rank 0 reads
    [2, -15]: the -15 is a consequence, not a crash. KILL (-9) is kept: it is also
    what the kernel's OOM killer sends.
    """
    own = [code for code in codes if code != -signal.SIGTERM]
    return own or list(codes)


def launcher_exit_code(codes: Sequence[int]) -> int:
    """The launcher's exit code for the failed workers' codes (negative: killed by a signal).

    Any crash makes the run a crash (1); otherwise a usage error (2) wins over a
    bad node (76), and that over a signal-stop (75): requeueing cannot fix a usage
    error, and a bad node needs a requeue without it.
    """
    codes = own_exit_codes(codes)
    if not codes or any(code not in NOT_RETRIED for code in codes):
        return EXIT_CRASH
    for code in (EXIT_USAGE, EXIT_BAD_NODE):
        if code in codes:
            return code
    return EXIT_REQUEUE


def is_retried(codes: Sequence[int], stop_requested: bool) -> bool:
    """Restart the worker group (--max-restarts) only for a crash, and never after a stop request."""
    return not stop_requested and launcher_exit_code(codes) == EXIT_CRASH


def first_crash(failures: dict) -> tuple:
    """(global rank, failure) of the first worker that ended on its own (torchrun's root cause)."""
    own = [item for item in failures.items() if item[1].exitcode in own_exit_codes(
        [f.exitcode for f in failures.values()])]
    # min() keeps the first of equal timestamps (whole seconds): the earliest captured.
    return min(own, key=lambda item: item[1].timestamp)


def crash_summary(rank: int, host: str, exitcode: int, log_dir: str | None) -> str:
    """One line for a crashed worker; its own output (traceback included) is above it."""
    if exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with {exitcode}"
    where = "its output above"
    if log_dir:  # where the plan sets --log-dir, it also prefixes each worker's lines
        where += f" (lines starting '{host}:rank{rank}:') or its log under {log_dir}"
    return f"ddp-launch: error: worker rank {rank} on {host} {how} (crash): see {where}"


def write_crash_report(env: Mapping[str, str], host: str, rank: int | None, exitcode: int, now: float,
                       line: str = "") -> str | None:
    """Say in the run dir that this node is up and its launcher ended the step (ddp_contract.launcher_reports):
    its workers were killed, or it stopped with `line` (a usage error, a port taken), so that the roll
    call's silence of all its ranks is not taken for a lost node and the other nodes name its line.
    None, or a warning line where it cannot be written."""
    run_dir = env.get(launcher_reports.RUN_DIR_VAR, "")
    if not run_dir:  # a launcher started by hand, outside the job scripts: no quarantine reads it
        return None
    node = launcher_reports.node_name(env, host)
    problem = launcher_reports.write(run_dir, node, exitcode, line, rank, now)
    if problem:
        return f"ddp-launch: warning: {problem}: the job script may take {node} for a lost node"
    return None


def worker_error_line(log_dir: str | None) -> str:
    """Local rank 0's last error line from its log under torchrun's --log-dir (<run>/attempt_<N>/0/stderr.log,
    the newest): the line a usage error says, which the other nodes then name. "" when there is none."""
    if not log_dir:
        return ""
    logs = []
    for top, _dirs, files in os.walk(log_dir):
        if "stderr.log" in files and os.path.basename(top) == "0" and "attempt_" in top:
            path = os.path.join(top, "stderr.log")
            try:
                logs.append((os.path.getmtime(path), path))
            except OSError:
                continue
    for _, path in sorted(logs, reverse=True)[:1]:
        try:
            with open(path, "rb") as handle:
                handle.seek(max(0, os.path.getsize(path) - 65536))
                tail = handle.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [line.strip() for line in tail if ": error: " in line]
        return errors[-1] if errors else ""
    return ""


def process_started_at(proc: str = "/proc") -> float:
    """When this process started, in seconds since the epoch: field 22 of /proc/self/stat in clock ticks
    after boot, and the boot's time, btime of /proc/stat (proc(5)). The exec'd launcher's own start: the
    launcher and the agent are one process."""
    try:
        with open(f"{proc}/self/stat") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open(f"{proc}/stat") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


class PeerStopWatch:
    """While this node's launcher waits in the rendezvous, another node's may have stopped with a line
    of its own (a usage error on the head: its rendezvous store never comes up, or goes): it says so
    in the run dir, and this node then names that line and ends with its code, at once, instead of
    waiting out the store's timeout and being killed by srun (--wait) as if it had crashed."""

    def __init__(self, env: Mapping[str, str], host: str, started_at: float, workers: Callable[[], list[int]],
                 stop: Callable[[str, int], None], poll_s: float = 1.0):
        self.run_dir = env.get(launcher_reports.RUN_DIR_VAR, "")
        self.node = launcher_reports.node_name(env, host)
        self.started_at, self.workers, self.stop, self.poll_s = started_at, workers, stop, poll_s
        self._done = threading.Event()

    def start(self) -> "PeerStopWatch":
        if self.run_dir:
            threading.Thread(target=self._run, name="ddp-peer-stop", daemon=True).start()
        return self

    def cancel(self) -> None:
        self._done.set()

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            if self.workers():  # the rendezvous completed: the workers' own errors tell from here on
                return
            report = launcher_reports.stopped_first(self.run_dir, self.node, self.started_at)
            if report is not None:
                self.stop(f"ddp-launch: error: {launcher_reports.stopped_line(report)}; this node stops too",
                          int(report["exitcode"]) if int(report["exitcode"]) > 0 else EXIT_CRASH)
                return


def rendezvous_failure(kind: str, endpoint: str, nnodes: str, detail: str) -> str:
    """One line for a rendezvous that failed, instead of torchrun's nested traceback."""
    if "EADDRINUSE" in detail or "address already in use" in detail.lower():
        port = endpoint.rsplit(":", 1)[-1]
        return (f"ddp-launch: error: rendezvous port {port} on the head node ({endpoint}) is already in use by "
                f"another process: pass a free port with --rdzv-port / DDP_LAUNCH_RDZV_PORT (the default is "
                f"derived from the job id, so another job's or program's listener there is the cause)")
    detail = f" ({detail})" if detail else ""
    if kind == "timeout":
        return (f"ddp-launch: error: rendezvous at {endpoint} timed out before all {nnodes} node(s) "
                f"joined{detail}: check that srun started ddp-launch on every node and that the head is "
                f"reachable (ddp-launch doctor), or raise --rdzv-timeout / DDP_LAUNCH_RDZV_TIMEOUT")
    return (f"ddp-launch: error: rendezvous store at {endpoint} failed{detail}: check that the head node's "
            f"launcher is running and the port is reachable from here (ddp-launch doctor), or raise "
            f"--rdzv-timeout / DDP_LAUNCH_RDZV_TIMEOUT if the head starts late")


def log_dir_problem(log_dir: str | None) -> str | None:
    """Create torchrun's --log-dir now; one line saying why not (torchrun's own makedirs
    would end in a traceback), or None."""
    if not log_dir:
        return None
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as error:
        return (f"ddp-launch: error: --log-dir {log_dir} cannot be created ({error.strerror or error}): "
                f"pass a directory you can write, or leave --log-dir out")
    return None


# Under this many free bytes, a worker's own lines (its error line included) may be cut off
# from its log: torchrun's --tee shows the workers' output by reading those files back.
FULL_LOG_DIR_BYTES = 1 << 20


def full_log_dir_note(log_dir: str | None, free_bytes: Callable[[str], int] | None = None) -> str | None:
    """One line when the workers failed with their logs on a (nearly) full file system, or None."""
    if not log_dir:
        return None
    try:
        free = (free_bytes or contract_free_bytes)(log_dir)
    except OSError:
        return None
    if free >= FULL_LOG_DIR_BYTES:
        return None
    return (f"ddp-launch: error: the workers' logs under {log_dir} are on a full file system "
            f"({free // 1024} KiB free), so their own error lines may be missing above: "
            f"free space there, or pass another --run-dir")


def first_line(error: BaseException) -> str:
    """The innermost cause's first line: the C++ store error, without its stack frames."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class StopRequest:
    """The first stop signal this agent got; every one is forwarded to the workers."""

    def __init__(self, children: Callable[[], list[int]], stop_now: Callable[[int], None]):
        self.signum: int | None = None
        self._children = children
        self._stop_now = stop_now

    def handle(self, signum: int, _frame: object = None) -> None:
        if self.signum is None:
            self.signum = signum
        workers = self._children()
        if not workers:
            # Still in the rendezvous (or between restart rounds): nothing to
            # checkpoint, so stop now rather than start workers after a stop.
            self._stop_now(signum)
        for pid in workers:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


def retry_crashes_only(agent_class: type, stop: StopRequest) -> bool:
    """Make the agent's --max-restarts apply to crashes only; False if torch changed under us.

    The hook: SimpleElasticAgent._invoke_run restarts a FAILED group while
    self._remaining_restarts > 0, right after _monitor_workers reports it. Zeroing
    the count inside _monitor_workers for a usage error or a stop sends the loop to
    its stop-and-return branch instead; LocalElasticAgent does the same itself for a
    worker stuck in D-state. Private API, guarded by a test with the real torchrun
    (tests/unit/launch/test_launch_outcomes.py: a usage error with --max-restarts 2).
    """
    monitor = getattr(agent_class, "_monitor_workers", None)
    if monitor is None:
        return False

    def monitor_workers(self, worker_group):
        result = monitor(self, worker_group)
        if result.is_failed():
            codes = [failure.exitcode for failure in result.failures.values()]
            if not is_retried(codes, stop.signum is not None):
                self._remaining_restarts = 0
        return result

    agent_class._monitor_workers = monitor_workers
    return True


# torchrun's log records about ending a worker group ("failed (exitcode: 2)
# local_rank: 0 ...", "Sending process N closing signal SIGTERM", "Received 15
# death signal"): a usage error or a stop is said once by the worker itself, a
# crash gets crash_summary and a stop before the workers its own line.
WORKER_END_RECORDS = ("failed (exitcode", "Sending process", "Received ")
WORKER_END_LOGGERS = ("torch.distributed.elastic.multiprocessing.api",
                      "torch.distributed.elastic.agent.server.api")


class _DropWorkerEndRecords:
    @staticmethod
    def filter(record) -> bool:
        return not str(record.msg).startswith(WORKER_END_RECORDS)


def _import_torch_quietly() -> None:
    # The agent's only C++ is the rendezvous store; its failures come back as
    # Python exceptions that get one line here, while its C++ log repeats them
    # with stack frames every retry. Quiet in this process only: the workers
    # inherit the user's setting (TORCH_CPP_LOG_LEVEL=INFO shows it all again).
    previous = os.environ.get("TORCH_CPP_LOG_LEVEL")
    if previous is None:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        import torch.distributed.run  # noqa: F401
    finally:
        if previous is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]


def main(argv: list[str] | None = None) -> int:
    import logging

    _import_torch_quietly()
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def stop_now(signum: int) -> None:
        raise SignalException(f"ddp-launch got {signal.Signals(signum).name}", sigval=signal.Signals(signum))

    stop = StopRequest(lambda: child_pids(os.getpid()), stop_now)
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, stop.handle)
    retry_crashes_only(LocalElasticAgent, stop)
    for name in WORKER_END_LOGGERS:
        logging.getLogger(name).addFilter(_DropWorkerEndRecords)
    os.environ[PARENT_PID_VARIABLE] = str(os.getpid())  # the workers inherit it (worker.py)
    heartbeats = heartbeat_directory()
    os.environ[HEARTBEAT_DIR_VAR] = heartbeats  # the workers' heartbeats (watchdog.py)
    watchdog = Watchdog(heartbeats).start()

    def stop_with_peer(line: str, code: int) -> None:  # from the watch's thread: no worker to wait for
        print(line, file=sys.stderr, flush=True)
        shutil.rmtree(heartbeats, ignore_errors=True)
        os._exit(code)

    peers = PeerStopWatch(os.environ, socket.gethostname(), process_started_at(),
                          lambda: child_pids(os.getpid()), stop_with_peer).start()
    try:
        return _run_torchrun(torchrun, argv)
    finally:
        peers.cancel()
        watchdog.stop()
        shutil.rmtree(heartbeats, ignore_errors=True)


def _run_torchrun(torchrun, argv: list[str] | None) -> int:
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousTimeoutError

    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)
    if hasattr(args, "signals_to_handle"):
        # torchrun would install its own TERM handler over ours in every round.
        args.signals_to_handle = ",".join(TORCHRUN_HANDLED_SIGNALS)
    problem = log_dir_problem(args.log_dir)
    if problem:
        print(problem, file=sys.stderr)
        _said_in_run_dir(socket.gethostname(), EXIT_USAGE, problem)
        return EXIT_USAGE
    # The workers inherit it: a recovery's record measures torchrun's rendezvous from here (ddp_train.recovery).
    os.environ[RENDEZVOUS_STARTED_VAR] = f"{time.time():.3f}"
    try:
        torchrun.run(args)
    except ChildFailedError as failure:
        codes = [f.exitcode for f in failure.failures.values()]
        code = launcher_exit_code(codes)
        if code == EXIT_REQUEUE:
            print("ddp-launch: workers stopped on a signal after saving a checkpoint "
                  f"(exit {EXIT_REQUEUE}): resubmit or requeue to resume", file=sys.stderr)
        elif code == EXIT_CRASH:
            rank, first = first_crash(failure.failures)
            # A worker that exited on its own after another node's launcher stopped on an error of its own
            # (a usage error of its rank 0) lost its peers to that error: named as the rendezvous's end is,
            # whether the workload's own collective or the store noticed first.
            peer = _stopped_first(socket.gethostname()) if first.exitcode > 0 and args.nnodes not in ("1", "1:1") \
                else None
            if peer is not None:
                print(f"ddp-launch: error: {launcher_reports.stopped_line(peer)}; the rendezvous at "
                      f"{args.rdzv_endpoint} ended with it", file=sys.stderr)
                return int(peer["exitcode"]) if int(peer["exitcode"]) > 0 else EXIT_CRASH
            print(crash_summary(rank, socket.gethostname(), first.exitcode, args.log_dir), file=sys.stderr)
            # Killed by a signal (KILL by a user, the OOM killer or our hang watchdog; SEGV): it died here,
            # on a node that is up. A worker that exited on its own may have lost its peers: on a node
            # cut off the network its ranks' roll call cannot reach the store (PeerLost, exit 1).
            warning = (write_crash_report(os.environ, socket.gethostname(), rank, first.exitcode, time.time())
                       if first.exitcode < 0 else None)
            if warning:
                print(warning, file=sys.stderr)
        # EXIT_USAGE: the worker's own line says what to fix; nothing to add, unless a full
        # disk kept that line out of its log. The other nodes name it (launcher_reports).
        if code == EXIT_USAGE:
            _said_in_run_dir(socket.gethostname(), code, worker_error_line(args.log_dir))
        note = full_log_dir_note(args.log_dir)
        if note:
            print(note, file=sys.stderr)
        return code
    except (RendezvousError, DistError) as error:
        kind = "timeout" if isinstance(error, RendezvousTimeoutError) else "connection"
        line = rendezvous_failure(kind, args.rdzv_endpoint, args.nnodes, first_line(error))
        if "already in use" in line:  # this node is the head and its port is taken: the others name it
            print(line, file=sys.stderr)
            _said_in_run_dir(socket.gethostname(), EXIT_RENDEZVOUS, line)
            return EXIT_RENDEZVOUS
        first = _stopped_first(socket.gethostname())
        if first is not None:  # the store went with a node that stopped on an error of its own
            print(f"ddp-launch: error: {launcher_reports.stopped_line(first)}; the rendezvous at "
                  f"{args.rdzv_endpoint} ended with it", file=sys.stderr)
            return int(first["exitcode"]) if int(first["exitcode"]) > 0 else EXIT_CRASH
        print(line, file=sys.stderr)
        return EXIT_RENDEZVOUS
    except SignalException as error:
        name = error.sigval.name
        if error.sigval in FORWARDED_SIGNALS:
            print(f"ddp-launch: stopped by {name} while no worker was running: nothing to save; "
                  f"resubmit or requeue to go on (exit {EXIT_REQUEUE})", file=sys.stderr)
            return EXIT_REQUEUE
        print(f"ddp-launch: stopped by {name}: the workers were sent {name}", file=sys.stderr)
        return 128 + int(error.sigval)
    return 0


# How long a node whose store failed waits for the report of the node that stopped first: that node
# writes it as it exits, and a shared file system may show it a moment later.
PEER_REPORT_WAIT_S = 5.0


def _said_in_run_dir(host: str, code: int, line: str) -> None:
    warning = write_crash_report(os.environ, host, None, code, time.time(), line)
    if warning:
        print(warning, file=sys.stderr)


def _stopped_first(host: str) -> dict | None:
    run_dir = os.environ.get(launcher_reports.RUN_DIR_VAR, "")
    if not run_dir:
        return None
    return launcher_reports.wait_for_stopped_first(run_dir, launcher_reports.node_name(os.environ, host),
                                                   process_started_at(), PEER_REPORT_WAIT_S)


if __name__ == "__main__":
    sys.exit(main())
