"""A one-line progress bar for terminals (rank 0 only); batch jobs' logs get plain lines.

Twenty lines instead of a tqdm dependency: it redraws at most every 0.25 s and never syncs
the GPU (it shows steps and wall-clock images/s only).
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class ProgressBar:
    def __init__(self, total_steps: int, label: str, enabled: bool, stream: Optional[TextIO] = None):
        # sys.stdout looked up now, not at import: it may have been replaced since (pytest, tee).
        stream = stream if stream is not None else sys.stdout
        self.total, self.label, self.stream = total_steps, label, stream
        self.enabled = enabled and stream.isatty()
        self.start = self.last = time.perf_counter()

    def update(self, step: int, images: int) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last < 0.25 and step < self.total):
            return
        self.last = now
        filled = int(24 * step / max(1, self.total))
        rate = images / max(now - self.start, 1e-9)
        self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (24 - filled)}] "
                          f"{step}/{self.total} {rate:,.0f} img/s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()
