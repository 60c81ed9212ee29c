"""Stop requests: SIGUSR2, SIGUSR1 and SIGTERM set a flag; the loop checkpoints and exits.

SLURM sends one of these before the time limit (`--signal=USR2@120`) or on preemption.
The handler only records the signal: the loop checks the flag at step boundaries, all ranks
agree by all-reduce, rank 0 writes a checkpoint, and every rank exits with EXIT_REQUEUE.
"""

from __future__ import annotations

import signal
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopFlag:
    def __init__(self) -> None:
        self.signum = 0  # 0: no stop requested

    def _handle(self, signum: int, frame: object) -> None:
        self.signum = signum

    def install(self) -> "StopFlag":
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def uninstall(self) -> None:
        for sig, handler in getattr(self, "_previous", {}).items():
            signal.signal(sig, handler)
