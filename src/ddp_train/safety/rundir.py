"""The run directory before training: can it be written, is there room, and where a replaced run goes.

Checked at the start instead of at the first checkpoint (by default after 10 epochs); a
--no-resume run moves the earlier run's checkpoints and metrics aside, it never deletes them.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
from pathlib import Path
from typing import Iterator, Mapping, Optional

import torch
from ddp_contract import free_bytes, rundir_lock

from ddp_train import console
from ddp_train.checkpoint import CHECKPOINT_NAME, PREVIOUS_NAME, SUMMARY_NAME
from ddp_train.distributed import agree_or_raise
from ddp_train.errors import TrainError
from ddp_train.metrics import METRICS_NAME

PREVIOUS_RUN_FILES = (CHECKPOINT_NAME, PREVIOUS_NAME, SUMMARY_NAME, METRICS_NAME)
PROBE_BYTES = 4096  # one file system block: enough to hit a full disk or an exceeded quota
PROBE_PREFIX = ".ddp-train-probe-"


def unwritable_message(run_dir: Path, code: Optional[int], reason: str) -> str:
    """One line for an OSError met while creating or probing the run dir, with its fix."""
    what = {
        errno.ENOSPC: "is full",
        errno.EDQUOT: "is over its disk quota (check it with your site's quota command)",
        errno.EROFS: "is on a read-only file system",
        errno.EACCES: "is not writable for this user",
        errno.EPERM: "is not writable for this user",
        errno.EEXIST: "is a file, not a directory",
        errno.ENOTDIR: "has a file where a parent directory should be",
    }.get(code or 0, "cannot be written")
    return f"--run-dir {run_dir} {what} ({reason}): pass another --run-dir, or fix that one"


def check_writable(run_dir: Path) -> None:
    """Create the run dir and write, fsync and remove a probe file in it (rank 0, before training)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f"{PROBE_PREFIX}{os.getpid()}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.write(fd, b"\0" * PROBE_BYTES)
                os.fsync(fd)  # a network file system may report a full quota only here
            finally:
                os.close(fd)
        finally:
            probe.unlink(missing_ok=True)
    except OSError as exc:
        raise TrainError(unwritable_message(run_dir, exc.errno, exc.strerror or str(exc))) from None


def low_space_warning(run_dir: Path, free: int, checkpoint_bytes: int) -> Optional[str]:
    """A checkpoint is written next to the one it replaces (checkpoint.save_atomic), so it needs
    room for two at once."""
    if free >= 2 * checkpoint_bytes:
        return None
    return (f"ddp-train: warning: --run-dir {run_dir} has {free / 2**20:.1f} MiB free, under twice "
            f"a checkpoint ({checkpoint_bytes / 2**20:.1f} MiB): saving it may fail; free space there "
            f"or pass another --run-dir")


def warn_if_low_space(run_dir: Path, checkpoint_bytes: int) -> None:
    warning = low_space_warning(run_dir, free_bytes(run_dir), checkpoint_bytes)
    if warning:
        console.warn(warning)


def aside_name(now: datetime.datetime) -> str:
    return f"checkpoint-{now.astimezone(datetime.timezone.utc):%Y%m%dT%H%M%SZ}"


def move_previous_run(run_dir: Path, now: datetime.datetime) -> Optional[Path]:
    """Move an earlier run's checkpoints and metrics into <run-dir>/checkpoint-<UTC time>/.

    Renames inside one directory tree are atomic, so each file is either in its old place or
    in the new one, never lost. Returns the new directory, or None when there was nothing.
    """
    found = [run_dir / name for name in PREVIOUS_RUN_FILES if os.path.lexists(run_dir / name)]
    if not found:
        return None
    target, suffix = run_dir / aside_name(now), 0
    while True:  # two --no-resume starts in one second get -1, -2, ...
        try:
            target.mkdir()
            break
        except FileExistsError:
            suffix += 1
            target = run_dir / f"{aside_name(now)}-{suffix}"
    for path in found:
        os.rename(path, target / path.name)
    for directory in (target, run_dir):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return target


def prepare(run_dir: Path, fresh: bool, now: datetime.datetime) -> Optional[Path]:
    """Rank 0's checks before training; returns where an earlier run went under --no-resume."""
    check_writable(run_dir)
    if not fresh:
        return None
    try:
        return move_previous_run(run_dir, now)
    except OSError as exc:
        raise TrainError(f"--no-resume could not move the earlier run in {run_dir} aside "
                         f"({exc.strerror or exc}): move {', '.join(PREVIOUS_RUN_FILES)} away yourself, "
                         f"or pass another --run-dir") from None


@contextlib.contextmanager
def held_by_this_job(run_dir: Path, env: Mapping[str, str], is_main: bool, device: torch.device,
                     fresh: bool) -> Iterator[Optional[Path]]:
    """Rank 0 holds <run-dir>/.ddp-run.lock (ddp_contract.rundir_lock) while the block runs, taken
    before anything in the run dir is read or written, then prepares the run dir (prepare: writable,
    and under --no-resume, `fresh`, the earlier run moved aside). A second job there or a run dir
    that fails its checks stops every rank with one line; the other ranks wait for rank 0's moves
    (one collective). Yields where the earlier run went, or None."""
    error, lock, moved_to = None, None, None
    if is_main:
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            lock = rundir_lock.RunDirLock.taken(str(run_dir), env)
            moved_to = prepare(run_dir, fresh, now=datetime.datetime.now(datetime.timezone.utc))
        except rundir_lock.LockHeld as held:
            error = TrainError(str(held))
        except OSError as exc:
            error = TrainError(unwritable_message(run_dir, exc.errno, exc.strerror or str(exc)))
        except TrainError as exc:
            error = exc
    try:
        agree_or_raise(error, device)
        yield moved_to
    finally:
        if lock is not None:
            lock.release()
