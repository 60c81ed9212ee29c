"""The trainer's one error type for user mistakes, and its exit codes.

Deep code raises TrainError with a message naming the thing and the fix; cli.main
prints it as one line and exits EXIT_USAGE. Anything else is a bug and keeps its traceback.
"""

import contextlib
import enum
from typing import Iterator, Optional

# EXIT_USAGE (2): a TrainError: bad flag, missing or corrupt dataset or checkpoint.
# EXIT_REQUEUE (75): stopped on request (SIGUSR2/SIGUSR1/SIGTERM) after writing a checkpoint: the
# run is unfinished and resumes from <run-dir>/checkpoint.pt. 75 is EX_TEMPFAIL in sysexits.h
# ("temporary failure; the user is invited to retry"), distinct from success, from usage errors
# and from 128+N deaths by signal, so a job script can requeue on it. Both codes are shared with
# ddp-launch and the job scripts, so they are written once, in ddp_contract.
from ddp_contract import EXIT_REQUEUE, EXIT_USAGE

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_REQUEUE", "PeerLost", "Seen", "TrainError", "seen_by"]

EXIT_OK = 0
EXIT_FAILURE = 1  # an unexpected exception (a traceback) or a peer rank failing


class Seen(enum.Enum):
    """Which ranks found an error, so that a job of many ranks prints it once (cli.main)."""

    BY_THIS_RANK = "rank"  # maybe by this rank alone (a corrupt file on its node): it prints
    BY_EVERY_RANK = "job"  # every rank alike (a flag, the world size): global rank 0 prints
    BY_EVERY_RANK_OF_NODE = "node"  # every rank of a node alike (its GPUs): local rank 0 prints
    ELSEWHERE = "elsewhere"  # another rank found it and prints it (distributed.agree_or_raise)


class TrainError(Exception):
    """A problem the user can fix: a bad flag, a missing dataset, a corrupt checkpoint."""

    def __init__(self, message: str, seen: Seen = Seen.BY_THIS_RANK):
        super().__init__(message)
        self.seen = seen


class PeerLost(Exception):
    """A node of the job went away mid-run (peers.roll_call): not a user mistake, so EXIT_FAILURE,
    but said in one line by one rank (`prints`) instead of a traceback per rank."""

    def __init__(self, message: str, prints: bool, report: Optional[dict] = None):
        super().__init__(message)
        self.prints = prints
        self.report = report  # for <run-dir>/roll-call.json when a node is gone (ddp_contract.roll_call.roll_call_report)


@contextlib.contextmanager
def seen_by(seen: Seen) -> Iterator[None]:
    """Mark the TrainErrors raised inside as found by `seen` (e.g. every rank parses the same flags)."""
    try:
        yield
    except TrainError as exc:
        exc.seen = seen
        raise
