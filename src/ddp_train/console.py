"""Rank 0's lines on stdout, which a full disk must not turn into a crash.

Under ddp-launch, torchrun points each worker's stdout at a file under <run-dir>/logs, so a full
disk or an exceeded quota can fail a print before it fails the next checkpoint. print() would
raise there with a traceback, and leave the unwritten text in Python's buffer for every later
flush (the interpreter's exit included) to fail on again. The console writes with os.write, so
nothing stays buffered; it keeps the first failure as `failed`, a TrainError that names the file,
the errno and the free space (as MetricsWriter does), and writes nothing after it. The trainer
stops every rank with it at the next agreement (distributed.agree_or_raise).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional, TextIO

from ddp_train import write_failure
from ddp_train.errors import TrainError

KEPT = "the checkpoint and the metrics already written are whole"


def output_path(fd: Optional[int]) -> Path:
    """The file behind a descriptor (/proc/self/fd, Linux), or /dev/stdout when it has no path."""
    if fd is not None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith("/"):
            return Path(target)
    return Path("/dev/stdout")


def _fileno(stream: TextIO) -> Optional[int]:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # pytest's capture, io.StringIO: no descriptor
        return None


def write_through(stream: TextIO, text: str) -> None:
    """Write text to the stream's descriptor, unbuffered (through the stream when it has none).
    Raises OSError as the write(2) under it does."""
    fd = _fileno(stream)
    if fd is None:
        stream.write(text)
        stream.flush()
        return
    stream.flush()  # whatever was printed through the stream itself goes first
    data = text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
    while data:
        data = data[os.write(fd, data):]


def warn(line: str) -> bool:
    """One line on stderr, whether it is written: a warning or an error line that a full disk
    keeps out of the log is lost, but it must not turn into a traceback, nor change the exit code."""
    try:
        write_through(sys.stderr, f"{line}\n")
    except OSError:
        return False
    return True


class Console:
    """A text stream for ProgressBar and the trainer's lines; writes only where `enabled` (rank 0)."""

    def __init__(self, enabled: bool, stream: Optional[TextIO] = None, kept: str = KEPT):
        # sys.stdout looked up now, not at import: it may have been replaced since (pytest, tee).
        self.stream = stream if stream is not None else sys.stdout
        self.enabled = enabled
        self.kept = kept  # what the error line says is unharmed
        self.failed: Optional[TrainError] = None

    def say(self, *lines: str) -> None:
        self.write("".join(f"{line}\n" for line in lines))

    def write(self, text: str) -> None:
        if not self.enabled or self.failed is not None or not text:
            return
        try:
            write_through(self.stream, text)
        except OSError as exc:
            path = output_path(_fileno(self.stream))
            self.failed = TrainError(write_failure.message("output log", path,
                                                           write_failure.describe(exc, path.parent), self.kept))

    def flush(self) -> None:
        """Every write is already out: os.write has no buffer of ours."""

    def isatty(self) -> bool:
        return self.stream.isatty()
