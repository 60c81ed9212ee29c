"""Checkpoints: where the run is (Progress), resuming from one and saving one, atomically.

Rank 0 writes a temporary file, fsyncs it and renames it into place, so <run-dir>/checkpoint.pt
is always a complete file; the one it replaces is kept as checkpoint.prev.pt. A crash mid-write
leaves both untouched (only a stray .tmp file). Every rank takes part in a resume and a save,
so an unusable checkpoint or a full disk stops every rank with one line from one of them.
After each checkpoint, its summary (checkpoint.json: the flags that bind the run, where it stands)
goes beside it, for the checks that run without torch before a job starts (ddp_contract.same_run).

A resume continues the checkpoint's run: the flags that make it that run must match, and --epochs
may grow (ddp_contract.same_run states the rule, for the learning rate and early stopping too);
reopen() says what this start changed in the run's plan, which the run's metrics record.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

import torch

from ddp_contract import same_run

from ddp_train import write_failure
from ddp_train.config import TrainConfig
from ddp_train.distributed import DistEnv, agree_or_raise, all_gather_objects
from ddp_train.errors import TrainError
from ddp_train.recipe.evaluate import target_reached

if TYPE_CHECKING:
    from ddp_train.recipe.learner import Learner

CHECKPOINT_NAME = "checkpoint.pt"
PREVIOUS_NAME = "checkpoint.prev.pt"
SUMMARY_NAME = same_run.SUMMARY_NAME
REQUIRED_KEYS = ("model", "optimizer", "scaler", "progress", "rng", "config")


@dataclass
class Progress:
    """Where the run is; saved in every checkpoint next to the weights."""
    epoch: int = 0  # epochs completed
    step: int = 0  # steps already done inside epoch `epoch` (after a mid-epoch stop)
    accuracies: list = field(default_factory=list)
    best_accuracy: float = 0.0
    train_time_s: float = 0.0
    images: int = 0
    # Epochs after the first of each process start: that one pays lazy loading and allocator
    # growth even after the warm-up pass, so it is left out of the steady images/s.
    steady_time_s: float = 0.0
    steady_images: int = 0
    setup_time_s: float = 0.0  # warm-up passes (compile, autotune, graph recording), off the clock
    early_stopped: bool = False
    finished: bool = False

    def add_training_time(self, images: int, seconds: float, warm_up_epoch: bool) -> None:
        self.train_time_s += seconds
        self.images += images
        if not warm_up_epoch:
            self.steady_time_s += seconds
            self.steady_images += images

    def add_accuracy(self, accuracy: float) -> None:
        self.accuracies.append(accuracy)
        self.best_accuracy = max(self.best_accuracy, accuracy)

    @property
    def images_per_s(self) -> float:
        return self.images / self.train_time_s if self.train_time_s else 0.0

    @property
    def steady_images_per_s(self) -> float:
        # With a single epoch per process start there is no steady epoch: the overall figure stands in.
        return self.steady_images / self.steady_time_s if self.steady_time_s else self.images_per_s

    @property
    def final_accuracy(self) -> float:
        return self.accuracies[-1] if self.accuracies else 0.0


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_NAME


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(document: Mapping[str, Any], path: Path) -> None:
    """A small JSON file written as save_atomic writes a checkpoint: whole, or not at all."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
    """How to go on from an unusable checkpoint; --no-resume keeps the old files (safety/rundir.py)."""
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


def wants_resume(requested: Optional[bool], checkpoint_exists: bool) -> bool:
    """--resume (True) and --no-resume (False) decide; with neither, a checkpoint there is resumed."""
    return requested if requested is not None else checkpoint_exists


def mismatch(saved_config: Mapping[str, Any], config: TrainConfig, path: Path) -> Optional[str]:
    """Why the checkpoint at `path` cannot be resumed with this config (a flag that binds the run
    differs, or --epochs is shorter), or None (ddp_contract.same_run's rule)."""
    return same_run.refusal(saved_config, config.to_dict(), str(path),
                            f"another --run-dir, or --no-resume (which keeps this run, moved aside into "
                            f"{path.parent}/checkpoint-<UTC time>/)")


@dataclass(frozen=True)
class PlanChange:
    """What a resume changed in its checkpoint's plan: a longer --epochs, an early stop lifted by this
    start's --target-accuracy or --patience (ddp_contract.same_run's rules)."""
    epochs_from: int
    epochs_to: int
    at_epoch: int  # epochs completed when this start resumed
    at_step: int  # steps done inside the next epoch
    early_stop_lifted: bool


def reopen(progress: Progress, saved_epochs: int, config: TrainConfig) -> Optional[PlanChange]:
    """The checkpoint's progress under this start's flags (in place), and what changed in its plan.

    A run that ended at its last epoch trains on when --epochs is now larger. A run that stopped early
    trains on only where the last epochs' accuracies no longer reach this start's --target-accuracy
    over --patience epochs; otherwise it stays ended, whatever --epochs says."""
    lifted = (progress.early_stopped and progress.epoch < config.epochs
              and not target_reached(progress.accuracies, config.target_accuracy, config.patience))
    if lifted:
        progress.early_stopped = False
    if progress.finished and not progress.early_stopped and progress.epoch < config.epochs:
        progress.finished = False
    if progress.finished or (config.epochs == saved_epochs and not lifted):
        return None  # nothing trains: the plan is the checkpoint's
    return PlanChange(saved_epochs, config.epochs, progress.epoch, progress.step, lifted)


def rng_for_rank(saved: Sequence[Any], rank: int, world_size: int) -> Optional[Any]:
    """This rank's saved RNG state; None when the world size changed (the ranks no longer match)."""
    return saved[rank] if len(saved) == world_size else None


def rng_state(device: torch.device) -> dict[str, Any]:
    return {"cpu": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


class Checkpointer:
    """One run's <run-dir>/checkpoint.pt: resume() and save() are called on every rank."""

    def __init__(self, config: TrainConfig, learner: Learner, dist_env: DistEnv, device: torch.device):
        self.path = checkpoint_path(config.run_dir)
        self.config, self.learner, self.dist_env, self.device = config, learner, dist_env, device
        self.plan_change: Optional[PlanChange] = None  # what resume() changed in the run's plan

    def resume(self) -> Optional[Progress]:
        """The saved progress, with the learner's state and this rank's RNG restored;
        None for a fresh start. A checkpoint that does not fit is one TrainError on every rank."""
        if not wants_resume(self.config.resume, self.path.exists()):
            return None
        error: Optional[TrainError] = None
        progress = None
        try:
            progress = self._restore()
        except TrainError as exc:
            error = exc
        agree_or_raise(error, self.device)
        return progress

    def _restore(self) -> Progress:
        if not self.path.exists():
            raise TrainError(f"--resume but there is no checkpoint at {self.path}")
        saved = load(self.path)
        problem = mismatch(saved["config"], self.config, self.path)
        if problem:
            raise TrainError(problem)
        try:
            self.learner.load_state_dict(saved)
            progress = Progress(**saved["progress"])
            rng = rng_for_rank(saved["rng"], self.dist_env.rank, self.dist_env.world_size)
            if rng is not None:
                set_rng_state(rng, self.device)
            self.plan_change = reopen(progress, int(saved["config"]["epochs"]), self.config)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:  # edited or foreign state
            detail = (str(exc).strip().splitlines() or [""])[0][:120]
            raise TrainError(f"checkpoint {self.path} does not fit this run ({type(exc).__name__}: "
                             f"{detail}); {recovery_hint(self.path)}") from None
        return progress

    def save(self, progress: Progress) -> None:
        """Every rank's RNG to rank 0, which writes the file; every rank stops if the write failed."""
        rngs = all_gather_objects(rng_state(self.device))  # collective: every rank
        if not self.dist_env.is_main:
            agree_or_raise(None, self.device)  # rank 0's write went through, or not
            return
        error: Optional[TrainError] = None
        try:
            save_atomic({
                **self.learner.state_dict(),  # model, optimizer, scaler, ema
                "progress": asdict(progress),
                "rng": rngs,
                "config": self.config.to_dict(),
                "world_size": self.dist_env.world_size,
                "torch": str(torch.__version__),
            }, self.path)
            # After the checkpoint: a summary that lags it by one save lets a check pass that the
            # trainer then refuses, never the other way round (ddp_contract.same_run).
            write_json_atomic(same_run.summary(self.config.to_dict(), asdict(progress)),
                              self.path.with_name(SUMMARY_NAME))
        except (OSError, RuntimeError) as exc:  # a full disk, a quota, EFBIG (torch's zip writer
            # raises RuntimeError over the OSError). save_atomic wrote a temporary file: whatever
            # checkpoint was there is untouched.
            error = TrainError(write_failure.message("checkpoint", self.path,
                                                     write_failure.describe(exc, self.path.parent),
                                                     "the checkpoint already there is unchanged"))
        agree_or_raise(error, self.device)  # every rank stops together, one line from rank 0
