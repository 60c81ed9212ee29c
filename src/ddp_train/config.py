"""Command line -> TrainConfig, a frozen dataclass the run writes into its metrics and checkpoint.

Precedence, stated once: an explicit flag > the --demo preset > the --recipe preset > DEFAULTS.
No torch here, so `ddp-train --help` and argument errors are instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ddp_train.errors import TrainError

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
SCHEDULES = ("constant", "cosine", "linear")
LR_SCALINGS = ("world-size", "none")


@dataclass(frozen=True)
class TrainConfig:
    data_dir: str = "data"
    run_dir: str = "runs/train"
    batch_size: int = 512  # global, split evenly across ranks (the seed's meaning)
    epochs: int = 5
    base_lr: float = 0.01  # per-GPU learning rate; see lr_scaling
    lr_scaling: str = "world-size"  # lr = base_lr * world_size (linear scaling rule, seed 001)
    target_accuracy: float = 0.85
    patience: int = 2  # early stop when the last `patience` epochs all reach the target
    precision: str = "auto"  # auto: bf16 on GPUs that support it, fp32 on CPU
    width_scale: float = 1.0  # 1.0 is the guide's WideResNet (16, 160, 320, 640)
    dropout: float = 0.01
    recipe: str = "improved"
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    label_smoothing: float = 0.0
    warmup_epochs: float = 0.0
    schedule: str = "constant"
    ema_decay: float = 0.0  # 0 disables the weight EMA
    tta: bool = False  # flip test-time augmentation in evaluation
    checkpoint_every: int = 10  # epochs; 0 = only on a stop signal and at the end
    resume: Optional[bool] = None  # None: resume when <run-dir>/checkpoint.pt exists
    allow_unverified_data: bool = False
    download: bool = False
    compile: bool = False
    seed: int = 0
    demo: bool = False
    device: str = "auto"
    limit_train: int = 0  # 0 = the whole split; >0 uses the first N images
    limit_test: int = 0
    eval_batch_size: int = 1024  # per rank
    dist_timeout_s: float = 600.0  # collectives fail instead of hanging after a peer died
    stop_check_every: int = 10  # steps between all-reduces of the stop flag

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The seed guide's plain recipe, kept for like-for-like comparisons.
GUIDE_RECIPE: Mapping[str, Any] = {
    "base_lr": 0.01,
    "nesterov": False,
    "label_smoothing": 0.0,
    "warmup_epochs": 0.0,
    "schedule": "constant",
    "ema_decay": 0.0,
    "tta": False,
}
# Standard, cheap CIFAR improvements (airbench / hlb-CIFAR10 / WRN practice), each a flag.
IMPROVED_RECIPE: Mapping[str, Any] = {
    "base_lr": 0.05,
    "nesterov": True,
    "label_smoothing": 0.1,
    "warmup_epochs": 1.0,
    "schedule": "cosine",
    "ema_decay": 0.0,
    "tta": True,
}
RECIPES: Mapping[str, Mapping[str, Any]] = {"guide": GUIDE_RECIPE, "improved": IMPROVED_RECIPE}

# A couple of minutes on a 2-core laptop: a narrow model on a few thousand images.
DEMO_PRESET: Mapping[str, Any] = {
    "width_scale": 1 / 16,
    "epochs": 2,
    "batch_size": 128,
    "base_lr": 0.1,
    "warmup_epochs": 0.2,
    "limit_train": 4000,
    "limit_test": 1000,
    "checkpoint_every": 1,
    "target_accuracy": 1.0,
    "resume": False,  # `make demo` twice trains twice; real runs resume automatically
}


class _OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print only `ddp-train: error: ...` (exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise TrainError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrorParser(
        prog="ddp-train",
        description="DDP WideResNet training on CIFAR-100 (start it with ddp-launch or torchrun).",
        argument_default=argparse.SUPPRESS,  # only flags the user gave reach the config
    )
    add = p.add_argument
    add("--data-dir", help="directory holding cifar-100-python/ (default: data)")
    add("--run-dir", help="metrics.jsonl and checkpoints go here (default: runs/train)")
    add("--batch-size", type=int, help="global batch size, split across ranks (default: 512)")
    add("--epochs", type=int, help="number of epochs (default: 5)")
    add("--base-lr", type=float, help="per-GPU learning rate (guide: 0.01, improved: 0.05)")
    add("--lr-scaling", choices=LR_SCALINGS, help="world-size: lr = base_lr * world size (default)")
    add("--target-accuracy", type=float, help="early-stop accuracy (default: 0.85)")
    add("--patience", type=int, help="epochs that must all reach the target (default: 2)")
    add("--precision", choices=PRECISIONS, help="default auto: bf16 on capable GPUs, fp32 on CPU")
    add("--width-scale", type=float, help="multiply the WideResNet widths (default: 1.0)")
    add("--dropout", type=float, help="dropout inside residual blocks (default: 0.01)")
    add("--recipe", choices=tuple(RECIPES), help="guide: the seed's plain SGD; improved (default)")
    add("--momentum", type=float, help="SGD momentum (default: 0.9)")
    add("--nesterov", action=argparse.BooleanOptionalAction, help="Nesterov momentum")
    add("--weight-decay", type=float, help="SGD weight decay (default: 5e-4)")
    add("--label-smoothing", type=float, help="cross-entropy label smoothing")
    add("--warmup-epochs", type=float, help="linear LR warm-up length in epochs")
    add("--schedule", choices=SCHEDULES, help="LR decay after warm-up")
    add("--ema-decay", type=float, help="weight EMA decay per step, evaluated instead (0: off)")
    add("--tta", action=argparse.BooleanOptionalAction, help="flip test-time augmentation")
    add("--checkpoint-every", type=int, help="epochs between checkpoints (0: on stop/end only)")
    add("--resume", action=argparse.BooleanOptionalAction,
        help="resume from <run-dir>/checkpoint.pt (default: when it exists)")
    add("--allow-unverified-data", action="store_true",
        help="accept CIFAR-format files that are not the official ones (generated data)")
    add("--download", action="store_true",
        help="fetch CIFAR-100 into --data-dir and exit (login node, once)")
    add("--compile", action="store_true", help="torch.compile the model")
    add("--seed", type=int, help="random seed (default: 0)")
    add("--demo", action="store_true",
        help="small CPU run: real data if present, else generated data")
    add("--device", choices=("auto", "cpu", "cuda"), help="default auto: cuda when available")
    add("--limit-train", type=int, help="use only the first N training images")
    add("--limit-test", type=int, help="use only the first N test images")
    add("--eval-batch-size", type=int, help="evaluation batch per rank (default: 1024)")
    add("--dist-timeout-s", type=float, help="process-group timeout in seconds (default: 600)")
    add("--stop-check-every", type=int, help="steps between stop-signal checks (default: 10)")
    return p


def config_from_args(argv: Optional[Sequence[str]] = None) -> TrainConfig:
    given = vars(build_parser().parse_args(sys.argv[1:] if argv is None else list(argv)))
    recipe = given.get("recipe", TrainConfig.recipe)
    values: dict[str, Any] = dict(RECIPES[recipe])
    if given.get("demo"):
        values.update(DEMO_PRESET)
    values.update(given)
    config = TrainConfig(**values)
    check_config(config)
    return config


def check_config(config: TrainConfig) -> None:
    """Reject values that cannot work, naming the flag and a valid value."""
    positive_ints = {
        "--batch-size": config.batch_size,
        "--epochs": config.epochs,
        "--patience": config.patience,
        "--eval-batch-size": config.eval_batch_size,
        "--stop-check-every": config.stop_check_every,
    }
    for flag, value in positive_ints.items():
        if value < 1:
            raise TrainError(f"{flag} {value} must be at least 1")
    if config.width_scale <= 0:
        raise TrainError(f"--width-scale {config.width_scale} must be positive (1.0 is the full model)")
    if not 0.0 <= config.dropout < 1.0:
        raise TrainError(f"--dropout {config.dropout} must be in [0, 1)")
    if not 0.0 <= config.ema_decay < 1.0:
        raise TrainError(f"--ema-decay {config.ema_decay} must be in [0, 1) (0 turns EMA off)")
    if not 0.0 <= config.label_smoothing < 1.0:
        raise TrainError(f"--label-smoothing {config.label_smoothing} must be in [0, 1)")
    for flag, value in {"--checkpoint-every": config.checkpoint_every,
                        "--limit-train": config.limit_train,
                        "--limit-test": config.limit_test}.items():
        if value < 0:
            raise TrainError(f"{flag} {value} must not be negative (0 means off / all)")
    if config.base_lr <= 0:
        raise TrainError(f"--base-lr {config.base_lr} must be positive")
    if config.warmup_epochs < 0:
        raise TrainError(f"--warmup-epochs {config.warmup_epochs} must not be negative")
    if config.dist_timeout_s <= 0:
        raise TrainError(f"--dist-timeout-s {config.dist_timeout_s} must be positive")


def check_world(config: TrainConfig, world_size: int) -> None:
    """The global batch must split evenly so every rank runs the same number of steps."""
    if config.batch_size % world_size:
        raise TrainError(
            f"--batch-size {config.batch_size} is not divisible by the world size {world_size}: "
            f"it is the global batch, pass a multiple of {world_size}")


def peak_lr(config: TrainConfig, world_size: int) -> float:
    """Linear scaling rule from a per-GPU base LR (seed 001): lr = base_lr * world_size."""
    return config.base_lr * (world_size if config.lr_scaling == "world-size" else 1)


def resolve_precision(requested: str, device_type: str, bf16_supported: bool) -> str:
    """auto: bf16 on GPUs that support it (fp16 with a GradScaler on older ones), fp32 on CPU."""
    if requested == "auto":
        if device_type != "cuda":
            return "fp32"
        return "bf16" if bf16_supported else "fp16"
    if requested not in PRECISIONS:
        raise TrainError(f"unknown precision {requested!r}: use one of {', '.join(PRECISIONS)}")
    if requested == "bf16" and device_type == "cuda" and not bf16_supported:
        raise TrainError("--precision bf16 but this GPU has no bf16 support: use --precision fp16")
    return requested
