"""`ddp-train` / `python -m ddp_train`: parse flags, then download or train.

A TrainError (a user mistake) becomes one line `ddp-train: error: ...` on stderr and exit 2,
printed once for the whole job; anything else keeps its traceback. Exit codes: errors.py.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Mapping, Optional, Sequence

from ddp_train.config import config_from_args
from ddp_train.console import warn
from ddp_train.errors import EXIT_FAILURE, EXIT_USAGE, PeerLost, Seen, TrainError, seen_by


# torchrun stops every worker as soon as one exits non-zero, so a rank that stays quiet about an
# error and exits first would kill the rank that prints it before it has said why. Quiet ranks
# wait this long; once the printing rank has exited, torchrun's SIGTERM ends the wait at once.
QUIET_RANK_GRACE_S = 5.0


def _rank_variable(env: Mapping[str, str], name: str) -> int:
    """RANK / LOCAL_RANK as torchrun sets them; 0 when unset or garbage (DistEnv names that mistake)."""
    try:
        return int(env.get(name, "0"))
    except ValueError:
        return 0


def prints_error(seen: Seen, rank: int, local_rank: int) -> bool:
    """Whether this process prints an error, so that a job of many ranks shows it once."""
    if seen is Seen.ELSEWHERE:
        return False
    if seen is Seen.BY_EVERY_RANK:
        return rank == 0
    if seen is Seen.BY_EVERY_RANK_OF_NODE:
        return local_rank == 0
    return True


def one_line(message: str) -> str:
    """A path may hold a newline; the error must still be one line."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def _keep_unencodable_output() -> None:
    """A non-UTF-8 path (bytes that decode to surrogates) prints escaped instead of crashing a
    finished run at its summary line (stdout is strict under a UTF-8 locale)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _world_size(env: Mapping[str, str]) -> int:
    try:
        return int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def say_once(prints: bool, message: str, env: Mapping[str, str]) -> None:
    """The one line of an error from the rank that prints it; in a distributed job every quiet
    rank waits QUIET_RANK_GRACE_S instead, so that its exit does not cut the printing rank short."""
    if prints:
        warn(f"ddp-train: error: {one_line(message)}")
    elif _world_size(env) > 1:
        time.sleep(QUIET_RANK_GRACE_S)


def _leave_now(code: int) -> None:
    """Exit without interpreter finalization, once the output is flushed (distributed runs only).

    A finished run must exit 0 every time, and with gloo it did not: DDP's
    reducer keeps the process group alive after destroy_process_group(), so its worker threads
    (pt_gloo_runloop) still run while the interpreter finalizes. A worker thread releases each
    finished collective after the caller has moved on: the final barrier's work holds the all-gather
    before it, whose tensors Python created, and freeing them takes the GIL. During finalization
    Python ends such a thread with pthread_exit() inside that noexcept destructor: "terminate called
    without an active exception", SIGABRT, exit -6 (a core dump of it shows ~AsyncBarrierWork ->
    ~AsyncAllgatherWork -> decref_pyobject -> take_gil -> PyThread_exit_thread while the main thread
    is in Py_FinalizeEx; pytorch#190489). The trainer's exit sequence in a small script hit it in 2
    of 40 torchrun runs of 4 gloo ranks on a busy machine, and in 0 of 40 when it left this way
    (benchmarks/exit_repeat.py counts the trainer itself). Every file the run wrote is closed (checkpoints fsynced, metrics appended and
    closed) and the group is destroyed, so finalization has nothing left to do but race those
    threads: os._exit skips it.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a full disk under the logs: what is lost is lost, the exit code stands
            pass
    os._exit(code)


def _main(argv: Optional[Sequence[str]], env: Mapping[str, str]) -> int:
    try:
        with seen_by(Seen.BY_EVERY_RANK):  # every rank parses the same command line
            config = config_from_args(argv)
        if config.download:
            from ddp_train.download import download_cifar100, refuse_inside_job
            refuse_inside_job(env)
            download_cifar100(config.data_dir)
            return 0
        from ddp_train.train import run  # torch is imported only when training
        return run(config, env)
    except TrainError as exc:
        say_once(prints_error(exc.seen, _rank_variable(env, "RANK"), _rank_variable(env, "LOCAL_RANK")),
                 str(exc), env)
        return EXIT_USAGE
    except PeerLost as exc:  # a node of the job went away: a crash, in one line
        say_once(exc.prints, str(exc), env)
        return EXIT_FAILURE


def main(argv: Optional[Sequence[str]] = None) -> int:
    _keep_unencodable_output()
    if _world_size(os.environ) <= 1:
        return _main(argv, os.environ)  # a process of its own: tests call this in-process
    try:
        code = _main(argv, os.environ)
    except Exception:  # a crash keeps its traceback, and its exit code 1 (not -6, see _leave_now)
        try:
            traceback.print_exc()
        except OSError:  # stderr's file is on a full disk: the exit code still says crash
            pass
        code = EXIT_FAILURE
    _leave_now(code)
    return code  # not reached
