"""Command line -> TrainConfig, a frozen dataclass the run writes into its metrics and checkpoint.

Precedence, stated once: an explicit flag > the --demo preset > the --recipe preset > TrainConfig's
defaults, which are the improved recipe. Each field's flag and --help text are declared with it.
No torch here, so `ddp-train --help` and argument errors are instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Optional, Sequence

from ddp_contract.flag_errors import OneLineErrorParser

from ddp_train.fast import levers
from ddp_train.errors import TrainError

PRECISIONS = ("auto", "fp32", "fp16", "bf16")
# What --precision auto takes on a GPU with bf16. fp16 (loss-scaled on the device: fast/loss_scale.py) takes
# its place only if benchmarks/gpu_throughput.py --precisions bf16,fp16 measures it 2% or more faster
# and it trains as well (docs/benchmarks.md, "fp16 against bf16").
CUDA_AUTO_PRECISION = "bf16"
# Derived seeds (seed * 1_000_003 + epoch, per rank) must stay inside torch's 64-bit seeds.
MAX_SEED = 2**32 - 1
MAX_WIDTH_SCALE = 16.0  # 16x the guide's widths is ~4 G parameters: no GPU holds it
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600
SCHEDULES = ("constant", "cosine", "linear")
LR_SCALINGS = ("world-size", "batch", "none")
# torch.compile modes: "reduce-overhead" adds CUDA graphs; see COMPILE_MODE_AUTO.
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
GRAD_COMPRESSIONS = ("none", "bf16")
BACKENDS = ("auto", "nccl", "gloo")
# The global batch at which base_lr is given under --lr-scaling batch: the guide's single-GPU batch.
LR_REFERENCE_BATCH = 512
# Per-GPU batch when --batch-size is not given on CUDA. Measured on one H100, full model, compiled
# (docs/benchmarks.md, "The GPU path"):
# 1024 per GPU ran 5% faster than 512, and 2048 gave nothing more, so 1024 is where it stops paying.
GPU_BATCH_PER_RANK = 1024
CPU_DEFAULT_BATCH = 512


RECIPE_NAMES = ("guide", "improved")
DEVICES = ("auto", "cpu", "cuda")


def option(default: Any, help: str, **argparse_options: Any) -> Any:
    """A TrainConfig field and its command-line flag in one place: the default, the --help text and
    any argparse options (choices, action) beside the declaration. The flag is the field's name with
    dashes; its type comes from the field's annotation (flag_options)."""
    return dataclasses.field(default=default, metadata={"help": help, "argparse": argparse_options})


NEGATABLE = {"action": argparse.BooleanOptionalAction}
SWITCH = {"action": "store_true"}


@dataclass(frozen=True)
class TrainConfig:
    """What a run does. The defaults are the improved recipe, which `ddp-train` runs with no flags;
    --recipe guide sets GUIDE_RECIPE's values over them."""

    data_dir: str = option("data", "directory holding cifar-100-python/ (default: data)")
    run_dir: str = option("runs/train", "metrics.jsonl and checkpoints go here (default: runs/train)")
    # Global, split evenly across ranks; None: default_batch_size() for the device.
    batch_size: Optional[int] = option(
        None, f"global batch size, split across ranks (default: {GPU_BATCH_PER_RANK} per GPU on CUDA, "
              f"{CPU_DEFAULT_BATCH} on CPU)")
    epochs: int = option(5, "number of epochs (default: 5)")
    base_lr: float = option(0.05, "per-GPU learning rate (guide: 0.01, improved: 0.05)")
    # The LR follows the global batch, not the GPU count: the same --batch-size trains the same way on
    # 1 or 8 GPUs (peak_lr).
    lr_scaling: str = option(
        "batch", f"world-size: lr = base_lr * world size; batch: lr = base_lr * batch-size / "
                 f"{LR_REFERENCE_BATCH} (improved); none: lr = base_lr (guide)", choices=LR_SCALINGS)
    target_accuracy: float = option(0.85, "early-stop accuracy (default: 0.85)")
    # Early stop when the last `patience` epochs all reach the target.
    patience: int = option(2, "epochs that must all reach the target (default: 2)")
    precision: str = option("auto", "default auto: bf16 on capable GPUs, and on CPUs that compute it "
                                    "natively (AVX512_BF16, AMX), else fp32 on CPU", choices=PRECISIONS)
    # 1.0 is the guide's WideResNet (16, 160, 320, 640).
    width_scale: float = option(1.0, "multiply the WideResNet widths (default: 1.0)")
    # The guide's 0.01 cost 4-7% of H100 throughput for almost no regularisation (docs/benchmarks.md).
    dropout: float = option(0.0, "dropout inside residual blocks (guide: 0.01, improved: 0)")
    recipe: str = option(
        "improved", "guide: the Olivia guide's train_ddp.py exactly (plain SGD, unscaled LR, fp16, "
                    "batch 512); improved (default)", choices=RECIPE_NAMES)
    momentum: float = option(0.9, "SGD momentum (default: 0.9)")
    nesterov: bool = option(True, "Nesterov momentum", **NEGATABLE)
    weight_decay: float = option(5e-4, "SGD weight decay (default: 5e-4)")
    label_smoothing: float = option(0.1, "cross-entropy label smoothing")
    warmup_epochs: float = option(1.0, "linear LR warm-up length in epochs")
    schedule: str = option("cosine", "LR decay after warm-up", choices=SCHEDULES)
    # 0 disables the weight EMA.
    ema_decay: float = option(0.0, "weight EMA decay per step, evaluated instead (0: off)")
    tta: bool = option(True, "flip test-time augmentation", **NEGATABLE)
    # Epochs; 0 = only on a stop signal and at the end.
    checkpoint_every: int = option(10, "epochs between checkpoints (0: on stop/end only)")
    # None: resume when <run-dir>/checkpoint.pt exists.
    resume: Optional[bool] = option(None, "resume from <run-dir>/checkpoint.pt (default: when it exists)",
                                    **NEGATABLE)
    allow_unverified_data: bool = option(
        False, "accept CIFAR-format files that are not the official ones (generated data)", **SWITCH)
    download: bool = option(False, "fetch CIFAR-100 into --data-dir and exit (login node, once)", **SWITCH)
    # None: compile on CUDA, not on CPU (compile_by_default).
    compile: Optional[bool] = option(None, "torch.compile the model (default: on CUDA, not on CPU)", **NEGATABLE)
    compile_mode: str = option("auto", "torch.compile mode; auto: reduce-overhead (CUDA graphs) on CUDA",
                               choices=COMPILE_MODES)
    # "": <run-dir>/compile-cache (speed.compile_cache_dir).
    compile_cache_dir: str = option("", "persistent compile cache (default: <run-dir>/compile-cache)")
    # fast/levers.py: auto (the device's measured defaults), none, or names.
    inductor_levers: str = option(
        "auto", "inductor options for a compiled step, comma-separated: coop-reductions, no-split-reductions, "
                "conv1x1-mm, pdl, combo-kernels; auto (default): those measured to win on CUDA; none")
    # fast/levers.py: our Triton BatchNorm kernels (fast/bn_blocks.py), or torch's.
    bn_kernels: str = option(
        "auto", "BatchNorm+ReLU(+add) in training: torch (nn.BatchNorm2d, inductor's kernels when compiled) or "
                "triton (our own kernels, CUDA only); auto (default): torch until a GPU measurement says otherwise",
        choices=levers.BN_KERNELS)
    # "bf16": DDP's bf16_compress_hook for slow fabrics.
    grad_compression: str = option("none", "bf16: halve the gradient all-reduce bytes (slow fabrics; NCCL or gloo)",
                                   choices=GRAD_COMPRESSIONS)
    # The process group's backend; resolve_backend.
    backend: str = option(
        "auto", "process-group backend; auto: nccl on GPUs, gloo on CPU; gloo also trains on GPUs "
                "(gradients all-reduced over TCP, for nodes where NCCL does not work)", choices=BACKENDS)
    # Micro-batches per optimizer step (learner.accumulate_gradients).
    grad_accum_steps: int = option(
        1, "split each rank's share of --batch-size into N micro-batches, one gradient all-reduce "
           "per step (when the share does not fit in GPU memory; default: 1)")
    # DDP's default; checked in benchmarks/ddp_buckets.py.
    bucket_cap_mb: float = option(25.0, "DDP gradient bucket size in MB (default: 25)")
    seed: int = option(0, "random seed (default: 0)")
    demo: bool = option(False, "small CPU run: real data if present, else generated data", **SWITCH)
    device: str = option("auto", "default auto: cuda when available", choices=DEVICES)
    # 0 = the whole split; >0 uses the first N images.
    limit_train: int = option(0, "use only the first N training images")
    limit_test: int = option(0, "use only the first N test images")
    eval_batch_size: int = option(1024, "evaluation batch per rank (default: 1024)")  # per rank
    # Collectives fail instead of hanging after a peer died.
    dist_timeout_s: float = option(600.0, "process-group timeout in seconds (default: 600)")
    # Steps between all-reduces of the stop flag.
    stop_check_every: int = option(10, "steps between stop-signal checks (default: 10)")
    # The job scripts' fabric gate, run by the trainer's own ranks (gate/run.py, on_the_training_group):
    # one container start, torch import and rendezvous per rank instead of two.
    fabric_gate: bool = option(
        False, "before the first step, check the fabric on the training's process group (all-reduce data "
               "and bandwidth, gate.json in --run-dir); a node it names ends the run with exit 76, before "
               "anything is trained", **SWITCH)
    site: str = option("", "site profile whose published figures --fabric-gate judges by "
                           "(default: $DDP_LAUNCH_SITE; none: judged by comparison alone)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# The Olivia guide's train_ddp.py, value for value, so a run compares with it like for like
# (https://documentation.sigma2.no/code_development/guides/pytorch_olivia/PyTorchMultiGpu.html):
# its argparse defaults (global --batch-size 512, --epochs 5, --base-lr 0.01, --target-accuracy
# 0.85, --patience 2); SGD(lr=args.base_lr, momentum=0.9, weight_decay=5e-4), the LR passed
# unscaled whatever the GPU count (its job scripts raise --base-lr by hand instead);
# nn.CrossEntropyLoss() without smoothing; no schedule, warm-up, EMA or TTA; fp16 autocast with a
# GradScaler (torch.amp.autocast('cuda') is float16); the model's dropout 0.01.
GUIDE_RECIPE: Mapping[str, Any] = {
    "batch_size": 512,
    "epochs": 5,
    "base_lr": 0.01,
    "lr_scaling": "none",
    "target_accuracy": 0.85,
    "patience": 2,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "nesterov": False,
    "label_smoothing": 0.0,
    "warmup_epochs": 0.0,
    "schedule": "constant",
    "ema_decay": 0.0,
    "tta": False,
    "dropout": 0.01,
    "precision": "fp16",
}
# Standard, cheap CIFAR improvements (airbench / hlb-CIFAR10 / WRN practice), each a flag: TrainConfig's
# own defaults, so the improved recipe sets nothing over them.
IMPROVED_RECIPE: Mapping[str, Any] = {}
RECIPES: Mapping[str, Mapping[str, Any]] = {"guide": GUIDE_RECIPE, "improved": IMPROVED_RECIPE}

# A couple of minutes on a 2-core laptop: a narrow model on a few thousand images.
DEMO_PRESET: Mapping[str, Any] = {
    "width_scale": 1 / 16,
    "epochs": 2,
    "batch_size": 128,
    "base_lr": 0.1,
    "lr_scaling": "world-size",
    "warmup_epochs": 0.2,
    "limit_train": 4000,
    "limit_test": 1000,
    "checkpoint_every": 1,
    "target_accuracy": 1.0,
    "resume": False,  # `make demo` twice trains twice; real runs resume automatically
}


class _OneLineErrorParser(OneLineErrorParser):
    """argparse prints usage plus the error; we print only `ddp-train: error: ...` (exit 2)."""

    usage_error = TrainError


def build_parser(config_class: type = None) -> argparse.ArgumentParser:
    """One flag per field of config_class (TrainConfig), its type, choices or action from the field."""
    p = _OneLineErrorParser(
        prog="ddp-train",
        description="DDP WideResNet training on CIFAR-100 (start it with ddp-launch or torchrun).",
        argument_default=argparse.SUPPRESS,  # only flags the user gave reach the config
        allow_abbrev=False,  # `--epoch 2` must not quietly mean --epochs (ddp-launch refuses it too)
    )
    config_class = config_class or TrainConfig
    hints = typing.get_type_hints(config_class)  # the annotations as types, not the strings they are here
    for field in dataclasses.fields(config_class):
        p.add_argument(_flag(field.name), help=field.metadata["help"], **flag_options(field, hints[field.name]))
    return p


def flag_options(field: dataclasses.Field, annotation: Any) -> dict[str, Any]:
    """argparse's options for a field's flag, from its declaration (option()) and its annotation:
    Optional[X] is X's flag (None is the default, never typed), Literal[...] is its choices, a bool
    a switch (off by default) or a --x/--no-x pair, tuple[X, ...] one or more X. Anything else is a
    declaration error, said when the parser is built rather than as a KeyError."""
    options = dict(field.metadata["argparse"])
    if "action" in options:
        return options
    base = _without_none(annotation)
    if typing.get_origin(base) is Literal:
        choices = typing.get_args(base)
        return {"choices": choices, "type": type(choices[0]), **options}
    if base is bool:
        return {"action": "store_true" if field.default is False else argparse.BooleanOptionalAction, **options}
    if typing.get_origin(base) is tuple and typing.get_args(base)[1:] == (Ellipsis,):
        return {"nargs": "+", "type": _scalar_type(field, typing.get_args(base)[0]), **options}
    if "choices" in options:
        return options
    return {"type": _scalar_type(field, base), **options}


def _without_none(annotation: Any) -> Any:
    """Optional[X] (Union[X, None], X | None) -> X; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def _scalar_type(field: dataclasses.Field, annotation: Any) -> type:
    if annotation in (str, int, float):
        return annotation
    raise TypeError(f"{field.name}: a flag cannot parse {annotation!r}; annotate it as str, int, "
                    f"float, bool, a Literal, Optional of one of those, or tuple[X, ...]")


def config_from_args(argv: Optional[Sequence[str]] = None) -> TrainConfig:
    given = vars(build_parser().parse_args(sys.argv[1:] if argv is None else list(argv)))
    recipe = given.get("recipe", TrainConfig.recipe)
    values: dict[str, Any] = dict(RECIPES[recipe])
    if given.get("demo"):
        values.update(DEMO_PRESET)
    values.update({name: tuple(value) if isinstance(value, list) else value for name, value in given.items()})
    config = TrainConfig(**values)
    check_config(config)
    return config


def check_config(config: TrainConfig) -> None:
    """Reject values that cannot work, naming the flag and a valid value."""
    check_limits(config)
    levers.parse(config.inductor_levers)
    positive_ints = {
        "--epochs": config.epochs,
        "--patience": config.patience,
        "--eval-batch-size": config.eval_batch_size,
        "--stop-check-every": config.stop_check_every,
        "--grad-accum-steps": config.grad_accum_steps,
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
    if config.batch_size is not None and config.batch_size < 1:
        raise TrainError(f"--batch-size {config.batch_size} must be at least 1")
    if config.bucket_cap_mb <= 0:
        raise TrainError(f"--bucket-cap-mb {config.bucket_cap_mb} must be positive (DDP's default is 25)")
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


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def check_limits(config: TrainConfig) -> None:
    """Values that parse but would crash deep inside torch (a NaN width, a seed torch cannot hold)."""
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise TrainError(f"{_flag(field.name)} {value} must be a finite number")
        if isinstance(value, str) and field.name in ("data_dir", "run_dir") and not value.strip():
            raise TrainError(f"{_flag(field.name)} is empty: pass a directory")
    if config.site and not config.fabric_gate:
        raise TrainError(f"--site {config.site} names the profile --fabric-gate judges by, and this run has no "
                         f"--fabric-gate: pass both, or neither")
    if config.width_scale > MAX_WIDTH_SCALE:
        raise TrainError(f"--width-scale {config.width_scale} is over {MAX_WIDTH_SCALE:g}: "
                         f"1.0 is the guide's 17 M-parameter model")
    if not 0.0 <= config.momentum < 1.0:
        raise TrainError(f"--momentum {config.momentum} must be in [0, 1) (default 0.9)")
    if config.nesterov and config.momentum == 0:
        raise TrainError("--momentum 0 with Nesterov momentum (the improved recipe's default): "
                         "pass --no-nesterov too, or a momentum such as 0.9")
    if config.weight_decay < 0:
        raise TrainError(f"--weight-decay {config.weight_decay} must not be negative (default 5e-4)")
    if config.target_accuracy < 0:
        raise TrainError(f"--target-accuracy {config.target_accuracy} must not be negative "
                         f"(over 1 never stops early)")
    if not 0 <= config.seed <= MAX_SEED:
        raise TrainError(f"--seed {config.seed} must be in 0..{MAX_SEED}")
    if config.dist_timeout_s > MAX_DIST_TIMEOUT_S:
        raise TrainError(f"--dist-timeout-s {config.dist_timeout_s:g} is over a week "
                         f"({MAX_DIST_TIMEOUT_S} s): a hung collective would hold the job that long")

