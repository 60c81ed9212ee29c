"""Stop requests: SIGUSR2, SIGUSR1 and SIGTERM set a flag; the loop checkpoints and exits.

SLURM sends one of these before the time limit (`--signal=USR2@120`) or on preemption.
The handler only records the signal: the loop checks the flag at step boundaries, all ranks
agree by all-reduce (StopVote), rank 0 writes a checkpoint, and every rank exits with EXIT_REQUEUE.
"""

from __future__ import annotations

import signal
from typing import Optional

import torch

from ddp_train.distributed import DelayedMax, max_over_ranks

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


class StopVote:
    """Every rank's stop flag, voted on (a max all-reduce) so that every rank stops at the same step.

    Inside an epoch, every `check_every` steps, the vote launched at the previous check is read
    and a new one launched (DelayedMax: the host never waits for the GPU); at an epoch's end
    the vote is blocking. Each returns the signal's name, or None to go on.
    """

    def __init__(self, flag: StopFlag, device: torch.device, check_every: int):
        self.flag, self.device, self.check_every = flag, device, check_every
        self.delayed = DelayedMax(device)

    def during_epoch(self, step: int, first_step: int) -> Optional[str]:
        if step == first_step or step % self.check_every:
            return None
        signum = self.delayed.read()  # the vote started one check ago: no wait
        if signum:
            return signal_name(signum)
        self.delayed.launch(self.flag.signum)
        return None

    def drain(self) -> None:
        """Drop the vote in flight: the blocking vote at the epoch's end sees the same flag."""
        self.delayed.read()

    def at_epoch_end(self) -> Optional[str]:
        signum = max_over_ranks(self.flag.signum, self.device)
        return signal_name(signum) if signum else None
