"""One resolve pass: the run's decisions (batch, precision, backend, compile mode, levers, BatchNorm kernels,
peak LR), made once from the flags, the device and the world, and read everywhere after.

Pure: facts in (the device's type, the world size, whether the GPU or the CPU computes bf16), a frozen
Decisions out; nothing here touches torch's state or the file system (train.run acts on it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from ddp_train.fast import levers
from ddp_train.config import (TrainConfig, check_world, compile_by_default, for_device, peak_lr, resolve_backend,
                              resolve_compile_mode)
from ddp_train.fast.cudagraph_report import uses_cuda_graphs
from ddp_train.errors import Seen, seen_by
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
    lr_peak: float  # the learning rate after warm-up (config.peak_lr)

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
    with seen_by(Seen.BY_EVERY_RANK):  # the same flags and world size on every rank: rank 0 tells
        check_world(config, world_size)  # after for_device: the default batch is checked too
    with seen_by(Seen.BY_EVERY_RANK_OF_NODE):  # the node's device and CPU
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
