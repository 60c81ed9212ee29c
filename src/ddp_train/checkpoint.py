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
REQUIRED_KEYS = ("model", "optimizer", "scaler", "progress", "rng", "config")


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


def recovery_hint(path: Path) -> str:
    """How to go on from an unusable checkpoint; --no-resume keeps the old files (rundir.py)."""
    previous = path.with_name(PREVIOUS_NAME)
    fresh = f"--no-resume starts fresh and moves it aside into {path.parent}/checkpoint-<UTC time>/"
    if previous.exists():
        return f"`mv {previous} {path}` resumes from the one before it, or {fresh}"
    return fresh


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:120]}" if lines else type(exc).__name__


def load(path: Path) -> dict[str, Any]:
    hint = recovery_hint(path)
    try:
        if path.stat().st_size == 0:
            raise TrainError(f"checkpoint {path} is empty (0 bytes: the disk filled up or the "
                             f"write was cut off); {hint}")
        # weights_only: a checkpoint is data (tensors, numbers, strings), never code.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except TrainError:
        raise
    except Exception as exc:
        raise TrainError(f"checkpoint {path} is corrupt or unreadable ({_first_line(exc)}); {hint}") from None
    missing = [key for key in REQUIRED_KEYS if key not in state] if isinstance(state, dict) else REQUIRED_KEYS
    if missing:
        raise TrainError(f"checkpoint {path} is not a ddp-train checkpoint (no {', '.join(missing)}); {hint}")
    return state


def estimated_bytes(model: torch.nn.Module, copies: int) -> int:
    """A checkpoint's size before one exists: the model's state `copies` times (weights,
    momentum buffers, an EMA copy)."""
    return copies * sum(t.numel() * t.element_size() for t in model.state_dict().values())
