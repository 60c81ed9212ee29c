"""torchrun with preemption signals forwarded: what ddp-launch execs in torchrun modes.

torchrun's agent turns TERM/INT/HUP/QUIT into an orderly stop of its workers,
but not USR1/USR2: their default action kills the agent and leaves the workers
training on as orphans. SLURM's `--signal=USR2@T` before the time limit is such
a signal, so the agent forwards it to its workers (the trainer checkpoints and
exits 75). When every failed worker exited 75 the agent exits 75 as well, so a
batch script can tell "stopped, checkpoint saved, requeue me" from a crash;
torchrun alone reports both as 1.

This module imports torch: it runs only after the exec, never in the launcher.
"""

from __future__ import annotations

import os
import signal
import sys

FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
EXIT_STOPPED = 75  # EX_TEMPFAIL, the trainer's exit code after a signal-stop
EXIT_RENDEZVOUS = 1  # what torchrun itself returns for a failed rendezvous


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


def forward_to_children(signum: int, _frame: object = None) -> None:
    for pid in child_pids(os.getpid()):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def all_stopped_for_requeue(exit_codes: list[int]) -> bool:
    return bool(exit_codes) and all(code == EXIT_STOPPED for code in exit_codes)


def rendezvous_failure(kind: str, endpoint: str, nnodes: str, detail: str) -> str:
    """One line for a rendezvous that failed, instead of torchrun's nested traceback."""
    detail = f" ({detail})" if detail else ""
    if kind == "timeout":
        return (f"ddp-launch: error: rendezvous at {endpoint} timed out before all {nnodes} node(s) "
                f"joined{detail}: check that srun started ddp-launch on every node and that the head is "
                f"reachable (ddp-launch doctor), or raise --rdzv-timeout / DDP_LAUNCH_RDZV_TIMEOUT")
    return (f"ddp-launch: error: rendezvous store at {endpoint} failed{detail}: check that the head node's "
            f"launcher is running and the port is reachable from here (ddp-launch doctor)")


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from torch.distributed.elastic.rendezvous.api import (RendezvousConnectionError,
                                                          RendezvousTimeoutError)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward_to_children)
    args = torchrun.parse_args(sys.argv[1:] if argv is None else argv)

    @record  # torchrun's own error report: which rank failed, on which host, with what
    def launch() -> int:
        try:
            torchrun.run(args)
        except ChildFailedError as failure:
            codes = [f.exitcode for f in failure.failures.values()]
            if all_stopped_for_requeue(codes):
                print("ddp-launch: workers stopped on a signal after saving a checkpoint "
                      f"(exit {EXIT_STOPPED}): resubmit or requeue to resume", file=sys.stderr)
                return EXIT_STOPPED
            raise
        except (RendezvousTimeoutError, RendezvousConnectionError) as error:
            kind = "timeout" if isinstance(error, RendezvousTimeoutError) else "connection"
            print(rendezvous_failure(kind, args.rdzv_endpoint, args.nnodes, str(error)), file=sys.stderr)
            return EXIT_RENDEZVOUS
        return 0

    return launch()


if __name__ == "__main__":
    sys.exit(main())
