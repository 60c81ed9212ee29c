"""One resolve pass: the run's decisions (batch, precision, backend, compile mode, levers, BatchNorm kernels,
peak LR), made once from the flags, the device and the world, and read everywhere after.

Pure: facts in (the device's type, the world size, whether the GPU or the CPU computes bf16), a frozen
Decisions out; nothing here touches torch's state or the file system (train.run acts on it). The rules of
each decision are here too, so that a reader of the run's decisions finds them in one file (the
precision's rule is precision.py's, with the CPU facts it rests on).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ddp_train.config import BACKENDS, CPU_DEFAULT_BATCH, GPU_BATCH_PER_RANK, LR_REFERENCE_BATCH, TrainConfig
from ddp_train.errors import Seen, TrainError
from ddp_train.fast import levers
from ddp_train.fast.cudagraph_report import uses_cuda_graphs
from ddp_train.precision import CpuBf16, Precision, choose_precision


@dataclass(frozen=True)
class Decisions:
    """What this run does, decided: the records (metrics.jsonl, the checkpoint) keep `config`, which
    holds the device's default batch and the backend as they were decided."""
    config: TrainConfig
    device_type: str
    world_size: int
    precision: Precision
    compiled: bool
    compile_mode: str  # "eager" when not compiled
    cuda_graphs: bool  # asked for; whether inductor kept them is cudagraph_report's answer
    levers: tuple[str, ...]  # inductor levers for a compiled step (fast/levers.py)
    bn_kernels: str  # who computes BatchNorm in training: torch or triton
    lr_peak: float  # the learning rate after warm-up (peak_lr)

    def with_cpu_bf16(self, agreed: CpuBf16) -> Decisions:
        """The precision again from every rank's answer (precision.agree_cpu_bf16): under --precision auto
        the nodes' CPUs may differ, and every rank must train in the same precision."""
        return dataclasses.replace(self, precision=choose_precision(self.config.precision, self.device_type,
                                                                    False, agreed))


def resolve(config: TrainConfig, device_type: str, world_size: int, gpu_bf16: bool,
            cpu_bf16: Optional[CpuBf16]) -> Decisions:
    """Every decision of the run, or the TrainError of the first that cannot be made (which ranks see
    it: errors.Seen)."""
    config = for_device(config, device_type, world_size)
    check_world(config, world_size)  # after for_device: the default batch is checked too
    precision = choose_precision(config.precision, device_type, gpu_bf16, cpu_bf16)
    config = dataclasses.replace(config, backend=resolve_backend(config.backend, device_type))
    compiled = compile_by_default(config, device_type)
    compile_mode = resolve_compile_mode(config, device_type) if compiled else "eager"
    return Decisions(
        config, device_type, world_size, precision, compiled, compile_mode,
        cuda_graphs=compiled and device_type == "cuda" and uses_cuda_graphs(compile_mode),
        levers=levers.resolve(config.inductor_levers, device_type, compiled),
        bn_kernels=levers.resolve_bn_kernels(config.bn_kernels, device_type),
        lr_peak=peak_lr(config, world_size))


# The rules, one per decision.

def for_device(config: TrainConfig, device_type: str, world_size: int) -> TrainConfig:
    """Fill the device-dependent defaults, so the checkpoint and metrics record what ran."""
    if config.batch_size is not None:
        return config
    return dataclasses.replace(config, batch_size=default_batch_size(device_type, world_size))


def default_batch_size(device_type: str, world_size: int) -> int:
    """The global batch when --batch-size is not given: the per-GPU batch that pays on GPUs."""
    return GPU_BATCH_PER_RANK * world_size if device_type == "cuda" else CPU_DEFAULT_BATCH


def check_world(config: TrainConfig, world_size: int) -> None:
    """The global batch must split evenly so every rank runs the same number of steps, and each
    rank's share into equal micro-batches, so the accumulated gradient is the batch's mean. The flags and
    the world size are the same on every rank: rank 0 tells (errors.Seen)."""
    if config.batch_size is not None and config.batch_size % world_size:
        raise TrainError(
            f"--batch-size {config.batch_size} is not divisible by the world size {world_size}: "
            f"it is the global batch, pass a multiple of {world_size}", Seen.BY_EVERY_RANK)
    parts = world_size * config.grad_accum_steps
    if config.batch_size is not None and config.batch_size % parts:
        raise TrainError(
            f"--batch-size {config.batch_size} is not divisible by the world size {world_size} times "
            f"--grad-accum-steps {config.grad_accum_steps}: pass a multiple of {parts}", Seen.BY_EVERY_RANK)


def peak_lr(config: TrainConfig, world_size: int) -> float:
    """The linear scaling rule (Goyal et al. 2017), from the batch it is stated for.

    world-size: lr = base_lr * world_size, base_lr being one GPU's LR.
    batch (the improved recipe): lr = base_lr * batch_size / LR_REFERENCE_BATCH, so the LR is a
    function of the global batch alone: 512 -> base_lr, 8 GPUs x 1024 -> 16 * base_lr.
    none (the guide's code): lr = base_lr, on any number of GPUs.
    """
    if config.lr_scaling == "world-size":
        return config.base_lr * world_size
    if config.lr_scaling == "batch":
        return config.base_lr * config.batch_size / LR_REFERENCE_BATCH
    return config.base_lr


def compile_by_default(config: TrainConfig, device_type: str) -> bool:
    """--compile/--no-compile when given; otherwise on CUDA only: the CPU path is for tests and
    demos, where a compile of minutes on a few cores would cost more than it saves."""
    return config.compile if config.compile is not None else device_type == "cuda"


def resolve_compile_mode(config: TrainConfig, device_type: str) -> str:
    """auto: CUDA graphs (reduce-overhead) on CUDA, because launch overhead is a fixed cost per
    step: it measured +11% at 256 per GPU under DDP (one H100), which is about 1.2 ms of an
    11 ms step; at 1024 per GPU the same 1.2 ms is ~3% of a ~40 ms step, still a gain, and every
    step has the same shapes (the last partial batch is dropped), so graphs are recorded once.
    benchmarks/gpu_throughput.py measures compiled with and without graphs side by side."""
    if config.compile_mode != "auto":
        return config.compile_mode
    return "reduce-overhead" if device_type == "cuda" else "default"


def resolve_backend(requested: str, device_type: str) -> str:
    """The process group's backend for this device.

    The torch.distributed backend table (https://pytorch.org/docs/stable/distributed.html#backends)
    gives gloo broadcast and all_reduce on CUDA tensors, which is all DDP's gradient sync needs,
    so gloo trains on GPUs too (the usual path where NCCL is missing or broken); NCCL has no CPU
    collectives at all, so it is refused on CPU here instead of failing in the first all-reduce.
    Every rank of a node has the same device: local rank 0 tells.
    """
    if requested == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if requested not in BACKENDS:
        raise TrainError(f"unknown --backend {requested!r}: use one of {', '.join(BACKENDS)}",
                         Seen.BY_EVERY_RANK_OF_NODE)
    if requested == "nccl" and device_type != "cuda":
        raise TrainError("--backend nccl needs CUDA GPUs (NCCL has no CPU collectives) and this run is on "
                         "the CPU: use --backend gloo, or run on GPU nodes (apptainer run --nv)",
                         Seen.BY_EVERY_RANK_OF_NODE)
    return requested
