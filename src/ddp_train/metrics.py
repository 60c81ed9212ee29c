"""<run-dir>/metrics.jsonl: one JSON object per line, appended by rank 0 and flushed each time.

Record types: "run" at every start (metadata), "extended" after it when the start resumed with a
longer --epochs or lifted an early stop (the rules it followed, ddp_contract.same_run), "epoch" after
each epoch, "stopped" when a signal ended the run early, "summary" at the end. Plotting and benchmark
tools read it.
No torch here: ddp-bench reads these files where torch is not installed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ddp_train import write_failure
from ddp_train.config import TrainConfig
from ddp_train.errors import TrainError

if TYPE_CHECKING:  # they import torch
    from ddp_train.checkpoint import Progress
    from ddp_train.distributed import World
    from ddp_train.recipe.evaluate import EvalResult
    from ddp_train.recipe.data import Steps

METRICS_NAME = "metrics.jsonl"


class MetricsWriter:
    """Appends whole lines: a write that fails (a full disk) is undone to the last whole line and
    kept as `failed`, for the trainer to stop every rank with (distributed.agree_or_raise)."""

    def __init__(self, run_dir: str | Path, enabled: bool):
        self.path = Path(run_dir) / METRICS_NAME
        self.enabled = enabled
        self.failed: Optional[TrainError] = None

    def write(self, record_type: str, **fields: Any) -> None:
        if not self.enabled or self.failed is not None:
            return
        record = {"type": record_type, "time": round(time.time(), 3), **fields}
        line = (json.dumps(record, sort_keys=False) + "\n").encode("utf-8")
        fd, size = -1, None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            size = os.fstat(fd).st_size
            written = 0
            while written < len(line):
                written += os.write(fd, line[written:])
        except OSError as exc:
            if size is not None:
                os.ftruncate(fd, size)  # no half line: readers parse every line as JSON
            self.failed = TrainError(write_failure.message("metrics", self.path,
                                                           write_failure.describe(exc, self.path.parent),
                                                           "the records already there are whole"))
        finally:
            if fd >= 0:
                os.close(fd)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@dataclass(frozen=True)
class RunStart:
    """What this process start trains with: its "run" record and its header line."""
    world: World
    config: TrainConfig
    precision: str
    lr: float
    compile_mode: str
    steps: Steps
    train_images: int
    test_images: int
    resumed: Optional[Progress]  # the checkpoint's progress, None for a fresh start
    precision_reason: str = ""  # why this precision (precision.choose_precision)
    data_generated_in: str = ""  # --demo's generated dataset, for want of CIFAR-100 ("": CIFAR-100)

    def record(self) -> dict[str, Any]:
        world, resumed = self.world, self.resumed
        return dict(
            world_size=world.size, nodes=world.nodes, gpus_per_node=world.gpus_per_node,
            processes_per_node=world.processes_per_node, device=world.device, gpu_model=world.gpu_model,
            cpu_model=world.cpu_model, precision=self.precision,
            precision_reason=self.precision_reason, batch_size=self.config.batch_size,
            batch_size_per_rank=self.steps.batch_per_rank, lr=self.lr, compile_mode=self.compile_mode,
            train_images=self.train_images, test_images=self.test_images,
            steps_per_epoch=self.steps.per_epoch, versions=world.versions,
            resumed_from_epoch=resumed.epoch if resumed is not None else None,
            resumed_from_step=resumed.step if resumed is not None else None,
            data_generated_in=self.data_generated_in or None, config=self.config.to_dict())

    def micro_batches(self) -> str:
        n = self.config.grad_accum_steps
        return f" in {n} micro-batches of {self.steps.batch_per_rank // n}" if n > 1 else ""

    def header(self) -> str:
        world = self.world
        what = world.gpu_model or f"CPU ({world.threads_per_process} threads per process)"
        return (f"ddp-train: {world.size} process(es) on {world.nodes} node(s), {what}, {self.precision}, "
                f"global batch {self.config.batch_size} ({self.steps.batch_per_rank} per rank{self.micro_batches()}), "
                f"lr {self.lr:g}, recipe {self.config.recipe}, {self.compile_mode}, "
                f"{self.steps.per_epoch} steps per epoch")


@dataclass(frozen=True)
class EpochEnd:
    """An epoch's "epoch" record and its printed line."""
    epoch: int  # counted from 1
    epochs: int
    seconds: float
    images: int
    train_loss: float
    result: EvalResult
    lr: float  # the last step's
    warm_up_epoch: bool  # the first epoch of this process start: left out of the steady figure

    def record(self) -> dict[str, Any]:
        result = self.result
        return dict(epoch=self.epoch, epoch_time_s=self.seconds, images=self.images,
                    images_per_s=self.images / self.seconds, train_loss=self.train_loss, val_loss=result.loss,
                    val_accuracy=result.accuracy, val_correct=result.correct, val_total=result.total,
                    lr=self.lr, warm_up_epoch=self.warm_up_epoch)

    def line(self) -> str:
        return (f"Epoch {self.epoch}/{self.epochs}: {self.seconds:.3f} s, {self.images / self.seconds:,.1f} "
                f"images/s, train loss {self.train_loss:.4f}, val loss {self.result.loss:.4f}, "
                f"val accuracy {self.result.accuracy:.4f}")


@dataclass(frozen=True)
class Extended:
    """A resume that changed the run's plan (checkpoint.PlanChange): its "extended" record, with the rules
    the learning rate and early stopping follow from here, and its line."""
    epochs_from: int
    epochs_to: int
    at_epoch: int
    at_step: int
    global_step: int
    lr_before: float  # the old plan's LR at the step reached
    lr_after: float  # the new plan's LR there: where the run goes on from
    early_stop_lifted: bool
    lr_rule: str
    early_stop_rule: str

    def record(self) -> dict[str, Any]:
        return dict(epochs_from=self.epochs_from, epochs_to=self.epochs_to, at_epoch=self.at_epoch,
                    at_step=self.at_step, global_step=self.global_step, lr_before=self.lr_before,
                    lr_after=self.lr_after, early_stop_lifted=self.early_stop_lifted, lr_rule=self.lr_rule,
                    early_stop_rule=self.early_stop_rule)

    def line(self) -> str:
        plan = (f"--epochs {self.epochs_from} -> {self.epochs_to}" if self.epochs_to != self.epochs_from
                else f"--epochs {self.epochs_to}")
        lifted = "; the early stop is lifted (its last epochs no longer reach the target)" if self.early_stop_lifted else ""
        return (f"Extended: {plan}, on from epoch {self.at_epoch + 1} step {self.at_step}: the LR follows the "
                f"schedule of a {self.epochs_to}-epoch run from its step {self.global_step} "
                f"({self.lr_before:g} under the old plan, {self.lr_after:g} now){lifted}")


@dataclass(frozen=True)
class Stopped:
    """A stop on a signal: the "stopped" record and the line that says how to resume."""
    signal: str
    epochs_completed: int
    step: int
    checkpoint: Path
    exit_code: int

    def record(self) -> dict[str, Any]:
        return dict(signal=self.signal, epochs_completed=self.epochs_completed, step=self.step,
                    checkpoint=str(self.checkpoint), exit_code=self.exit_code)

    def line(self) -> str:
        return (f"Stop requested ({self.signal}): checkpoint saved to {self.checkpoint} at epoch "
                f"{self.epochs_completed + 1}, step {self.step}. Run the same command again to resume "
                f"(exit code {self.exit_code}).")


def summary_record(progress: Progress, world: World, digests: Sequence[str],
                   ddp_layout: Optional[dict[str, Any]], wall_time_s: float) -> dict[str, Any]:
    """The "summary" record; steady_images_per_s leaves out each start's first epoch (Progress)."""
    return dict(
        total_time_s=progress.train_time_s, images_per_s=progress.images_per_s,
        steady_images_per_s=progress.steady_images_per_s, steady_time_s=progress.steady_time_s,
        setup_time_s=progress.setup_time_s, ddp=ddp_layout, wall_time_s=wall_time_s, nodes=world.nodes,
        gpus_per_node=world.gpus_per_node, world_size=world.size, final_accuracy=progress.final_accuracy,
        best_accuracy=progress.best_accuracy, epochs_run=progress.epoch, early_stopped=progress.early_stopped,
        parameter_digests=list(digests), ranks_in_sync=len(set(digests)) == 1)


def summary_lines(progress: Progress, world: World, metrics_path: Path) -> tuple[str, ...]:
    return (
        "",
        "Training Summary:",
        f"Total training time: {progress.train_time_s:.3f} seconds",
        f"Throughput: {progress.steady_images_per_s:.3f} images/second (steady state, each start's first "
        f"epoch excluded; {progress.images_per_s:.3f} over all epochs)",
        f"Setup time (warm-up: compile, autotune, outside the training time): {progress.setup_time_s:.3f} seconds",
        f"Number of nodes: {world.nodes}",
        f"Number of GPUs per node: {world.gpus_per_node}",
        f"Total GPUs used: {world.gpus_per_node * world.nodes}",
        f"World size: {world.size}",
        f"Final accuracy: {progress.final_accuracy:.4f}",
        f"Best accuracy: {progress.best_accuracy:.4f}",
        f"Metrics: {metrics_path}",
        "Training completed successfully.")
