"""Progress within an epoch, rank 0 only: a one-line bar on a terminal; in a batch job's log
(stdout not a terminal), a plain line every `line_every_s` seconds instead of carriage returns.

Twenty lines instead of a tqdm dependency: it redraws at most every 0.25 s and never syncs
the GPU (it shows steps and wall-clock images/s only).
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional, TextIO

# A batch log gets a line this often: enough to see a job is alive and how fast it goes,
# few enough that a 100-epoch job's .out stays readable.
LOG_LINE_EVERY_S = 30.0


def clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


class ProgressBar:
    def __init__(self, total_steps: int, label: str, enabled: bool, stream: Optional[TextIO] = None,
                 line_every_s: float = LOG_LINE_EVERY_S, clock: Callable[[], float] = time.perf_counter):
        # sys.stdout looked up now, not at import: it may have been replaced since (pytest, tee).
        stream = stream if stream is not None else sys.stdout
        self.total, self.label, self.stream, self.clock = total_steps, label, stream, clock
        self.enabled = enabled
        self.terminal = stream.isatty()
        self.every = 0.25 if self.terminal else line_every_s
        self.start = self.last = clock()

    def update(self, step: int, images: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self.terminal:
            if now - self.last < self.every and step < self.total:
                return
        elif now - self.last < self.every or step >= self.total:
            return  # the epoch's own line follows the last step
        self.last = now
        elapsed = now - self.start
        rate = images / max(elapsed, 1e-9)
        if self.terminal:
            filled = int(24 * step / max(1, self.total))
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (24 - filled)}] "
                              f"{step}/{self.total} {rate:,.0f} img/s")
        else:
            left = elapsed * (self.total - step) / max(step, 1)
            self.stream.write(f"{self.label}: step {step}/{self.total} ({100 * step // max(1, self.total)}%), "
                              f"{rate:,.0f} img/s, {clock_text(elapsed)} elapsed, ~{clock_text(left)} left\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.terminal:
            self.stream.write("\r\033[K")
            self.stream.flush()
