"""Atomic checkpoints: rank 0 writes a temporary file, fsyncs it and renames it into place.

<run-dir>/checkpoint.pt is always a complete file; the one it replaces is kept as
checkpoint.prev.pt. A crash mid-write leaves both untouched (only a stray .tmp file).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ddp_train.errors import TrainError

CHECKPOINT_NAME = "checkpoint.pt"
PREVIOUS_NAME = "checkpoint.prev.pt"


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(state: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a checkpoint is as readable as the run dir
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            _keep_previous(path)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _keep_previous(path: Path) -> None:
    """Hard-link (or copy) the current checkpoint to .prev, so `path` itself never goes missing."""
    previous = path.with_name(PREVIOUS_NAME)
    staging = path.with_name(f".{PREVIOUS_NAME}.tmp")
    staging.unlink(missing_ok=True)
    try:
        os.link(path, staging)
    except OSError:  # file systems without hard links
        shutil.copyfile(path, staging)
    os.replace(staging, previous)


def load(path: Path) -> dict[str, Any]:
    previous = path.with_name(PREVIOUS_NAME)
    hint = (f"move it aside to start fresh, or `mv {previous} {path}` to resume from the previous one"
            if previous.exists() else "move it aside (or pass --no-resume) to start fresh")
    try:
        # weights_only: a checkpoint is data (tensors, numbers, strings), never code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise TrainError(f"checkpoint {path} is corrupt or unreadable "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]}); {hint}") from None
    if not isinstance(state, dict) or "model" not in state or "progress" not in state:
        raise TrainError(f"checkpoint {path} is not a ddp-train checkpoint; {hint}")
    return state
