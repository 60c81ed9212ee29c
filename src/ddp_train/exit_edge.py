"""How a torch program run on many ranks ends: its error as one line, said by one rank while the others
wait, and in a job of several an exit that skips interpreter finalization. ddp-train and the gate end here.

No torch: cli.py imports this before it knows whether it will train.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Mapping, Optional

from ddp_contract.errors import one_line
from ddp_train.console import warn
from ddp_train.errors import Seen

# torchrun stops every worker as soon as one exits non-zero, so a rank that stays quiet about an
# error and exits first would kill the rank that prints it before it has said why. Quiet ranks
# wait this long; once the printing rank has exited, torchrun's SIGTERM ends the wait at once.
QUIET_RANK_GRACE_S = 5.0


def world_size(env: Mapping[str, str]) -> Optional[int]:
    """WORLD_SIZE as torchrun sets it: 1 when unset or empty, None when it is not an integer."""
    try:
        return int(env.get("WORLD_SIZE") or "1")
    except ValueError:
        return None


def in_a_job_of_several(env: Mapping[str, str]) -> bool:
    """Whether this process is one rank of several. A WORLD_SIZE that is not a number counts as a
    process of its own: DistEnv.from_env names that mistake, and it must be said, not cut short."""
    return (world_size(env) or 1) > 1


def rank_variable(env: Mapping[str, str], name: str) -> int:
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


def prints_here(seen: Seen, env: Mapping[str, str]) -> bool:
    """prints_error for this process, its ranks read from the launcher's variables."""
    return prints_error(seen, rank_variable(env, "RANK"), rank_variable(env, "LOCAL_RANK"))


def say_once(program: str, prints: bool, message: str, env: Mapping[str, str]) -> None:
    """`PROGRAM: error: MESSAGE` from the rank that prints it; in a distributed job every quiet
    rank waits QUIET_RANK_GRACE_S instead, so that its exit does not cut the printing rank short."""
    if prints:
        warn(f"{program}: error: {one_line(message)}")
    elif in_a_job_of_several(env):
        time.sleep(QUIET_RANK_GRACE_S)


def leave_now(code: int) -> None:
    """Exit without interpreter finalization, once the output is flushed (distributed runs only).

    A finished run must exit 0 every time, and with gloo it did not: DDP's
    reducer keeps the process group alive after destroy_process_group(), so its worker threads
    (pt_gloo_runloop) still run while the interpreter finalizes. A worker thread releases each
    finished collective after the caller has moved on: the final barrier's work holds the all-gather
    before it, whose tensors Python created, and freeing them takes the GIL. During finalization
    Python ends such a thread with pthread_exit() inside that noexcept destructor: "terminate called
    without an active exception", SIGABRT, exit -6 (a core dump of it shows ~AsyncBarrierWork ->
    ~AsyncAllgatherWork -> decref_pyobject -> take_gil -> PyThread_exit_thread while the main thread
    is in Py_FinalizeEx; https://github.com/pytorch/pytorch/pull/179291 describes it). The trainer's
    exit sequence in a small script hit it in 2 of 40 torchrun runs of 4 gloo ranks on a busy machine,
    and in 0 of 40 when it left this way (benchmarks/exit_repeat.py counts the trainer itself). Every
    file the run wrote is closed (checkpoints fsynced, metrics appended and closed) and the group is
    destroyed, so finalization has nothing left to do but race those threads: os._exit skips it.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a full disk under the logs: what is lost is lost, the exit code stands
            pass
    os._exit(code)
