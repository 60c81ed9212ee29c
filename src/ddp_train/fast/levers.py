"""Inductor's options for the memory-bound part of a compiled step (BatchNorm statistics and
normalisation, ReLU, the residual add), by name: what `--inductor-levers` takes and what
benchmarks/gpu_throughput.py measures one by one; and `--bn-kernels`, which runs that part on our
own Triton kernels instead (ddp_train/fast/bn_kernels.py).

Each lever is a set of `torch._inductor.config` options (names and meanings:
torch/_inductor/config.py). They are set for the whole process before the model compiles, since
torch.compile takes a mode or options, not both. A lever is on by default on CUDA only when a
GPU figure in docs/benchmarks.md says it wins there (CUDA_DEFAULT); no torch here at import time,
so `ddp-train --help` stays instant.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

from ddp_train.errors import Seen, TrainError

Options = tuple[tuple[str, Any], ...]

LEVERS: Mapping[str, tuple[str, Options]] = {
    "coop-reductions": ("BatchNorm reductions across thread blocks (implies no split)",
                        (("triton.cooperative_reductions", True),)),
    "no-split-reductions": ("BatchNorm reductions in one kernel, not split in two", (("split_reductions", False),)),
    "conv1x1-mm": ("the 1x1 shortcut convolutions as matmuls", (("conv_1x1_as_mm", True),)),
    "pdl": ("programmatic dependent launch (Hopper and later)", (("triton.enable_pdl", True),)),
    "combo-kernels": ("independent kernels combined into one launch", (("combo_kernels", True),)),
}

# On by default on CUDA: the levers measured to win on an H100. None did (docs/benchmarks.md,
# "Measured on an H100"): conv1x1-mm, pdl and combo-kernels were within 0.4% of plain graphs, and
# the two reduction levers made the whole step 6.7x slower.
CUDA_DEFAULT: tuple[str, ...] = ()

AUTO = "auto"
NONE = "none"


def parse(text: str) -> tuple[str, ...]:
    """`--inductor-levers` as lever names: "auto" (the device's defaults, resolved by resolve),
    "none", or a comma-separated list of LEVERS' names."""
    if text in (AUTO, NONE):
        return (text,)
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in LEVERS]
    if unknown or not names:
        raise TrainError(f"--inductor-levers {text!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; "
                         f"use auto, none or a comma-separated list of {', '.join(LEVERS)}")
    return names


def resolve(text: str, device_type: str, compiled: bool) -> tuple[str, ...]:
    """The levers a run uses: none unless it compiles; auto: CUDA_DEFAULT on CUDA, none elsewhere."""
    names = parse(text)
    if not compiled or names == (NONE,):
        return ()
    if names == (AUTO,):
        return CUDA_DEFAULT if device_type == "cuda" else ()
    return names


def options(names: tuple[str, ...]) -> Options:
    return tuple(option for name in names for option in LEVERS[name][1])


def missing(opts: Options) -> list[str]:
    """The options this torch's inductor does not have (a GPU image's torch may be older)."""
    import torch._inductor.config as inductor_config
    known = inductor_config.get_config_copy()
    return [name for name, _ in opts if name not in known]


def apply(names: tuple[str, ...]) -> None:
    """Set the levers' options for the rest of the process, before anything compiles. An option this
    torch lacks is an error naming it, not a lever silently off."""
    opts = options(names)
    if not opts:  # importing inductor's config imports torch._dynamo: ~1.5 CPU-s a process for nothing
        return
    absent = missing(opts)
    if absent:
        import torch
        raise TrainError(f"--inductor-levers {','.join(names)}: torch {torch.__version__} has no inductor option "
                         f"{', '.join(absent)}; pass --inductor-levers none or leave that lever out")
    import torch._inductor.config as inductor_config
    for name, value in opts:
        *parents, leaf = name.split(".")
        setattr(functools.reduce(getattr, parents, inductor_config), leaf, value)


# --bn-kernels: who computes BatchNorm (+ReLU, +residual add) in training. torch: nn.BatchNorm2d,
# which inductor turns into its own kernels when the model compiles; triton: our kernels
# (ddp_train/fast/bn_blocks.py), CUDA only. auto is torch on every device until benchmarks/gpu_throughput.py's
# triton-bn variant beats the graphs variant on a GPU (docs/benchmarks.md): then BN_CUDA_DEFAULT = "triton".
BN_KERNELS = (AUTO, "torch", "triton")
BN_CUDA_DEFAULT = "torch"


def resolve_bn_kernels(requested: str, device_type: str) -> str:
    """torch or triton for this device; triton where there is no CUDA GPU is a one-line error."""
    if requested == AUTO:
        return BN_CUDA_DEFAULT if device_type == "cuda" else "torch"
    if requested not in BN_KERNELS:
        raise TrainError(f"--bn-kernels {requested!r}: use {', '.join(BN_KERNELS)}")
    if requested == "triton" and device_type != "cuda":
        raise TrainError(f"--bn-kernels triton needs a CUDA GPU and this run is on {device_type} (Triton compiles "
                         f"for GPUs; on a CPU it only interprets, for tests): use --bn-kernels torch",
                         Seen.BY_EVERY_RANK_OF_NODE)  # the node's device, alike for its ranks
    return requested
