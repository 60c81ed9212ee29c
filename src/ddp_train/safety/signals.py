"""Stop requests: SIGUSR2, SIGUSR1 and SIGTERM set a flag; the loop checkpoints and exits.

SLURM sends one of these before the time limit or on preemption. The handler only records the
signal: the loop checks the flag at step boundaries, all ranks agree by all-reduce (StopVote),
rank 0 writes a checkpoint, and every rank exits with EXIT_REQUEUE.

A stop can also come as a file. Our job scripts ask for `--signal=B:USR2@120`, which SLURM
sends to the batch shell alone (sbatch(1), --signal): a signal sent to every process of the
step would also reach the `squashfuse_ll` that unprivileged Apptainer runs to serve the image,
and the workers would die of SIGBUS before any checkpoint (as apptainer#3197 shows for
SIGINT). The script's trap writes the signal's name into <run-dir>/STOP_REQUEST_FILE, and rank
0 reads it at most every REQUEST_POLL_S (one stat on a shared file system per rank-0 process,
not one per rank per step); the vote carries it to every rank.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Optional

import torch

from ddp_contract import STOP_REQUEST_FILE

from ddp_train.distributed import DelayedMax, max_over_ranks

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM)
REQUEST_POLL_S = 5.0


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopFlag:
    """The stop signal received, or the one a stop request file names (None: signals only)."""

    def __init__(self, request_file: Optional[Path] = None, poll_s: float = REQUEST_POLL_S) -> None:
        self.signum = 0  # 0: no stop requested
        self.request_file, self.poll_s = request_file, poll_s
        self._polled_at = -float("inf")

    def _handle(self, signum: int, frame: object) -> None:
        self.signum = signum

    @classmethod
    def installed_for(cls, run_dir: "str | Path", is_main: bool) -> "StopFlag":
        """Installed for a run: the signals on every rank, and on rank 0 the run dir's stop request
        file too (`ddp-launch stop` writes it; rank 0's vote carries it to every rank)."""
        return cls(stop_request_path(run_dir) if is_main else None).install()

    def install(self) -> "StopFlag":
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}
        return self

    def uninstall(self) -> None:
        for sig, handler in getattr(self, "_previous", {}).items():
            signal.signal(sig, handler)

    def requested(self) -> int:
        """The signal to stop on, 0 for none: a signal received, else the request file's."""
        now = time.monotonic()
        if not self.signum and self.request_file is not None and now - self._polled_at >= self.poll_s:
            self._polled_at = now
            self.signum = read_stop_request(self.request_file)
        return self.signum

    def clear_request(self) -> None:
        """Remove the request once acted on, so that a restart by hand does not stop at once."""
        if self.request_file is not None:
            try:
                self.request_file.unlink()
            except FileNotFoundError:
                pass


def stop_request_path(run_dir: "str | Path") -> Path:
    return Path(run_dir) / STOP_REQUEST_FILE


def read_stop_request(path: Path) -> int:
    """The signal a stop request names ("USR2", "SIGUSR2"), SIGUSR2 when it names none we know,
    0 when there is no request (or it cannot be read: a stop is never made up)."""
    try:
        name = path.read_text().strip().upper()
    except OSError:
        return 0
    name = name if name.startswith("SIG") else f"SIG{name}"
    known = {signal.Signals(sig).name: int(sig) for sig in STOP_SIGNALS}
    return known.get(name, int(signal.SIGUSR2))


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
        self.delayed.launch(self.flag.requested())
        return None

    def drain(self) -> None:
        """Drop the vote in flight: the blocking vote at the epoch's end sees the same flag."""
        self.delayed.read()

    def at_epoch_end(self) -> Optional[str]:
        signum = max_over_ranks(self.flag.requested(), self.device)
        return signal_name(signum) if signum else None
