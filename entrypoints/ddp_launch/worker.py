"""`python -m ddp_launch.worker (-m MODULE | SCRIPT) [ARGS]`: a workload that dies with its launcher.

Every worker starts through this: it asks Linux for SIGTERM when its parent dies, sets SLURM's task
variables to agree with the worker's own ranks (worker_env.py), then runs the workload exactly as
`python -m MODULE ARGS` / `python SCRIPT ARGS`, in this process.

A user's workload (not our trainer nor its gate, which do this themselves) gets here what needs none of its
code: the Flight Recorder's dump pointed into its run dir (NCCL dumps it there on a collective timeout),
every thread's Python stack in its log when it dies of a fatal signal (faulthandler: the abort of NCCL's
watchdog, a segfault), a check of a MASTER_ADDR it sets itself, the run's manifest written by rank 0
(ddp_contract.provenance: the script and its digest, the image, the variables and who set them, the
libraries it mapped), and, where it called ddp_contract.workload.progress(), the roll call that names a lost
node when a collective fails (docs/own-script.md).
"""

from __future__ import annotations

import atexit
import os
import runpy
import signal
import sys
import threading
import time

from ddp_contract import EXIT_USAGE
from ddp_launch import worker_env

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# SIGTERM, not SIGKILL: the trainer writes a checkpoint and exits 75 on it.
DEATH_SIGNAL = signal.SIGTERM
# Set by ddp_launch.agent to its own PID: the parent this worker must still have
# once the death signal is armed (see parent_already_gone).
PARENT_PID_VARIABLE = "DDP_LAUNCH_AGENT_PID"
EXIT_ORPHAN = 1
EXIT_CRASH = 1
# The module of ours: the built-in trainer and its own modules (the fabric gate) read our variables themselves.
OUR_PACKAGE = "ddp_train"
# Rank 0 alone prints a usage error, but torchrun TERMs every other worker as
# soon as one fails: a silent rank that exits 2 first kills rank 0 before it has
# said why. So the others wait this long before they exit 2; once rank 0 has
# exited, torchrun stops them at once, so the wait costs nothing then.
USAGE_GRACE_S = 5.0
USAGE = "usage: python -m ddp_launch.worker (-m MODULE | SCRIPT) [ARGS ...]"


def die_with_parent(signum: int = DEATH_SIGNAL) -> bool:
    """Have the kernel send signum to this process when its parent exits, even by SIGKILL.

    The "parent" is the thread that forked this process (prctl(2)): torchrun
    starts every worker with subprocess.Popen from its agent's main thread
    (SimpleElasticAgent._invoke_run -> LocalElasticAgent._start_workers ->
    SubprocessContext._start, no thread pool), which lives as long as the agent.
    False where there is no prctl: PR_SET_PDEATHSIG is Linux only, and the
    clusters this launcher serves run Linux; elsewhere (a laptop) it is skipped.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def parent_already_gone(expected: str | None, parent: int) -> bool:
    """The launcher died between forking us and die_with_parent(): no signal will ever come.

    Checked after arming, so a death after the check still signals (prctl(2) man
    page, PR_SET_PDEATHSIG: compare getppid() with the creator's PID).
    """
    return bool(expected) and expected.isdigit() and int(expected) != parent


def _say(line: str) -> None:
    # Every rank hits the same problem; one line from global rank 0 is enough.
    if os.environ.get("RANK", "0") == "0":
        print(f"ddp-launch: error: {line}", file=sys.stderr)


def _module_missing(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError as missing:  # a parent package is missing
        return missing.name is not None and module.startswith(missing.name)


def run_workload(argv: list[str]) -> int:
    """Run the workload in this process the way the python command line would."""
    if not argv or argv == ["-m"]:
        _say(USAGE)
        return EXIT_USAGE
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        if _module_missing(module):
            _say(f"no Python module named {module!r} (--module): check the name, or that the image "
                 f"installs it (python -m pip show)")
            return EXIT_USAGE
        sys.argv = [module, *args]  # run_module puts the module's file in argv[0], as -m does
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    script, args = argv[0], argv[1:]
    if not os.path.isfile(script):
        _say(f"--script {script!r} is not a file on this node (cwd {os.getcwd()})")
        return EXIT_USAGE
    sys.argv = [script, *args]
    # `python SCRIPT` puts the script's directory first on sys.path, not the cwd.
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


def is_ours(argv: list[str]) -> bool:
    """The workload is our trainer or one of its modules (python -m ddp_train[.gate])."""
    return argv[:1] == ["-m"] and len(argv) > 1 and (argv[1] == OUR_PACKAGE or argv[1].startswith(OUR_PACKAGE + "."))


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    expected = os.environ.pop(PARENT_PID_VARIABLE, None)  # not passed on to the workload
    if parent_already_gone(expected, os.getppid()):
        print(f"ddp-launch: error: the launcher (pid {expected}) exited before this worker started: "
              f"not running the workload", file=sys.stderr)
        return EXIT_ORPHAN
    argv = list(sys.argv[1:] if argv is None else argv)
    changes, problem = worker_env.scheduler_variables_for_worker(os.environ)
    problem = problem or worker_env.disagreement(os.environ)
    if problem:
        _say(problem)
        _let_rank_0_speak(EXIT_USAGE)
        return EXIT_USAGE
    os.environ.update(changes)
    users = None
    if not is_ours(argv):
        users = UsersWorkload.prepare(argv, os.environ)
        if users.problem:
            _say(users.problem)
            _let_rank_0_speak(EXIT_USAGE)
            return EXIT_USAGE
    try:
        code = run_workload(argv)
    except SystemExit as stop:  # the workload's sys.exit(): its status, as the interpreter would make it
        code = exit_status(stop.code)
    except Exception as error:
        printed = users.after_failure(error) if users is not None else None
        if printed is None:
            raise
        if not printed and int(os.environ.get("WORLD_SIZE") or "1") > 1:
            time.sleep(USAGE_GRACE_S)  # the rank that names the lost node must not be cut short
        return EXIT_CRASH
    finally:
        if users is not None:
            users.finish()
    _let_rank_0_speak(code)
    return code


class UsersWorkload:
    """What a user's workload gets from the worker that runs it, before it starts and when it ends."""

    def __init__(self, argv: list[str], env: dict, run_dir: str | None, rank: int):
        self.argv, self.env, self.run_dir, self.rank = argv, env, run_dir, rank
        self.launcher_set: dict[str, str] = {}
        self.lock = None
        self.problem: str | None = None     # why the workload must not start (its run dir is another job's)

    @classmethod
    def prepare(cls, argv: list[str], env) -> "UsersWorkload":
        import faulthandler

        from ddp_contract.heartbeat import FR_DUMP_VARS, flight_recorder_prefix
        run_dir = env.get("DDP_RUN_DIR") or None
        users = cls(argv, env, run_dir, _rank(env))
        if run_dir and not any(env.get(name) for name in FR_DUMP_VARS):
            # torch reads it when the process group starts (the Flight Recorder tutorial,
            # https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html): before the workload.
            env[FR_DUMP_VARS[0]] = flight_recorder_prefix(run_dir)
            users.launcher_set[FR_DUMP_VARS[0]] = ("launcher: the Flight Recorder dumps into <run-dir>/forensics "
                                                   "(NCCL's watchdog writes it on a collective timeout)")
        faulthandler.enable(all_threads=True)  # stderr: the worker's log
        worker_env.guard_master_addr(env, _say, EXIT_USAGE)
        users.take_run_dir()
        if users.problem is None:
            users.write_manifest()
        return users

    def take_run_dir(self) -> None:
        """One job per run dir, as for the trainer: rank 0 holds <run-dir>/.ddp-run.lock while the workload
        runs (ddp_contract.rundir_lock), so a second job given it stops in one line (the job scripts and the
        pods' preflight read the lock before they start anything)."""
        if self.rank != 0 or not self.run_dir or not os.path.isdir(self.run_dir):
            return
        from ddp_contract import rundir_lock
        try:
            self.lock = rundir_lock.RunDirLock.taken(self.run_dir, self.env)
        except rundir_lock.LockHeld as held:
            self.problem = str(held)
        except OSError as error:
            print(f"ddp-launch: warning: cannot take the run dir's lock in {self.run_dir} "
                  f"({error.strerror or error}): another job could use it too", file=sys.stderr)

    def workload(self) -> dict:
        from ddp_contract.provenance import file_digest
        if self.argv[:1] == ["-m"]:
            return {"module": self.argv[1], "args": self.argv[2:]}
        script = os.path.abspath(self.argv[0]) if self.argv else ""
        return {"script": script, "sha256": file_digest(script), "args": self.argv[1:]}

    def write_manifest(self) -> None:
        """Rank 0's manifest in the run dir, at the start and again at the end (with the libraries the
        workload loaded); a run dir it cannot write costs the manifest, never the run."""
        if self.rank != 0 or not self.run_dir or not self.argv:
            return
        from ddp_contract import provenance
        torch = sys.modules.get("torch")
        try:
            version = str(torch.__version__) if torch is not None else None
            if version is None:
                from importlib.metadata import PackageNotFoundError, version as installed
                try:
                    version = installed("torch")
                except PackageNotFoundError:
                    pass
            env = dict(self.env)
            manifest = provenance.workload_manifest(self.workload(), env, provenance.this_process(), version)
            for name, who in self.launcher_set.items():
                if name in manifest["environment"]:
                    manifest["environment"][name]["set_by"] = who
            provenance.write(self.run_dir, manifest)
        except OSError as error:
            print(f"ddp-launch: warning: cannot write the run's manifest in {self.run_dir} "
                  f"({error.strerror or error})", file=sys.stderr)

    def after_failure(self, error: BaseException) -> bool | None:
        """The roll call of ddp_contract.workload, where the workload took part (imported it)."""
        contract = sys.modules.get("ddp_contract.workload")
        return contract.after_failure(error) if contract is not None else None

    def finish(self) -> None:
        contract = sys.modules.get("ddp_contract.workload")
        if contract is not None:
            contract.finish()
        self.write_manifest()
        if self.lock is not None:
            self.lock.release()


def exit_status(code: object) -> int:
    """The process's exit status for sys.exit(code), by the interpreter's rule (sys.exit in the Python
    library reference): None is 0, an integer is itself, anything else is printed to stderr and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def leave(code: int) -> None:
    """Exit with code; past the interpreter's finalization where the workload used torch.

    A user's script that trains DDP on gloo and returns after destroy_process_group() aborted in 2 of 15
    runs on a loaded machine (benchmarks/exit_repeat.py --script): "terminate called without an active
    exception", exit 134 after the last step, its peers waiting for it. DDP's reducer keeps the process
    group alive, and a gloo worker thread that frees a finished collective's Python objects during
    finalization is ended inside a noexcept destructor (https://github.com/pytorch/pytorch/pull/179291
    describes it; ddp_train.exit_edge.leave_now, where our trainer leaves the same way, has the core dump).
    Finalization is replaced here by what of it a script relies on, in its order (Py_FinalizeEx: wait for
    the non-daemon threads, run the atexit functions, flush stdio), then os._exit with the script's status.
    """
    if "torch" not in sys.modules:
        sys.exit(code)
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()  # noqa: SLF001 - CPython's own call at exit; the module has no public one
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a full disk, or a stream the script closed: the status stands
            pass
    os._exit(code)


def _rank(env) -> int:
    try:
        return int(env.get("RANK") or "0")
    except ValueError:
        return 0


def _let_rank_0_speak(code: object) -> None:
    if code == EXIT_USAGE and os.environ.get("RANK", "0") != "0":
        time.sleep(USAGE_GRACE_S)


if __name__ == "__main__":
    leave(main())
