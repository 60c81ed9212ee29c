"""The run's precision and why: `--precision auto` trains in bf16 on a CPU that computes bf16
natively and in fp32 on one that would emulate it; the CPU is read once per process, every rank agrees.

What stays fp32 under torch's CPU bf16 autocast, as under the GPU path's (the CPU op lists in
aten/src/ATen/autocast_mode.cpp; https://pytorch.org/docs/stable/amp.html#cpu-ops-that-can-autocast-to-float32):
the loss (cross_entropy_loss is on the fp32 list); BatchNorm's running statistics and weights,
and its batch statistics, accumulated in fp32 (batch_norm is on neither list: it takes the
convolution's bf16 output and normalises it with fp32 statistics); the parameters, their
gradients and SGD (autocast casts copies of the weights, never the weights). bf16 has fp32's
exponent range, so no GradScaler. tests/unit/train/test_cpu_precision.py checks each of these.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ddp_train.config import CUDA_AUTO_PRECISION, PRECISIONS
from ddp_train.errors import Seen, TrainError

# The CPUID flags of bf16 arithmetic: AVX512_BF16 (bf16 dot products; Intel Cooper Lake, Sapphire
# Rapids and later, AMD Zen 4 and later) and AMX-BF16 (tile matrix multiplies; Intel Sapphire Rapids
# and later). oneDNN, which runs torch's CPU convolutions, dispatches bf16 to them (its ISAs
# avx512_core_bf16 and avx512_core_amx); without them it converts to fp32 and back around every
# operation, which ran at a third of fp32's speed here (docs/benchmarks.md, "bf16 on the CPU").
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

# oneDNN's cap on the ISA it dispatches to, and the values that keep it below AVX512_CORE_BF16
# (https://uxlfoundation.github.io/oneDNN/dev_guide_cpu_dispatcher_control.html): under such a cap
# bf16 is emulated on any CPU. oneDNN reads ONEDNN_MAX_CPU_ISA, else its older name DNNL_MAX_CPU_ISA,
# and compares the value in lower case (getenv_string_user in src/common/utils.cpp, init_max_cpu_isa
# in src/cpu/x64/cpu_isa_traits.cpp; https://github.com/uxlfoundation/oneDNN); a value it does not
# know caps nothing.
ISA_CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
ISA_CAPS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


@dataclass(frozen=True)
class CpuBf16:
    """Whether this CPU computes bf16 natively, and the fact that says so."""
    native: bool
    reason: str


def judge_cpu(capabilities: Mapping[str, Any], env: Mapping[str, str]) -> CpuBf16:
    """torch.cpu.get_capabilities()'s flags and oneDNN's ISA cap -> native bf16 or not.

    Detected, not measured: the flags are CPUID's (torch reads them with cpuinfo, as oneDNN does
    for its own dispatch), cost nothing and are the same on every start; a timed trial step would
    cost seconds per rank and, on a node shared with other jobs, flip between starts."""
    flags = [flag for flag in NATIVE_BF16_FLAGS if capabilities.get(flag)]
    architecture = str(capabilities.get("architecture") or "unknown")
    if not flags and not architecture.startswith("x86"):
        return CpuBf16(False, f"bf16 speed on {architecture} CPUs is not yet measured; --precision bf16 tries it")
    if not flags:
        return CpuBf16(False, f"the CPU has neither {' nor '.join(NATIVE_BF16_FLAGS)}: bf16 would be "
                              f"emulated, slower than fp32")
    cap_variable = next((name for name in ISA_CAP_VARIABLES if env.get(name, "").strip()), None)
    if cap_variable is not None:
        cap = env[cap_variable].strip().upper()
        if cap in ISA_CAPS_WITHOUT_BF16:
            return CpuBf16(False, f"{cap_variable}={cap} keeps oneDNN below AVX512_CORE_BF16: bf16 would be "
                                  f"emulated, slower than fp32")
    return CpuBf16(True, f"the CPU has {' and '.join(flags)}: it computes bf16 natively")


def cpu_capabilities() -> Mapping[str, Any]:
    """torch's view of this CPU: its cpuinfo flags (torch.cpu.get_capabilities; torch releases
    without it have the one flag function)."""
    import torch
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is not None:
        return dict(get_capabilities())
    avx512_bf16 = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    return {"architecture": platform.machine(), "avx512_bf16": bool(avx512_bf16())}


def read_cpu_bf16(env: Mapping[str, str]) -> CpuBf16:
    return judge_cpu(cpu_capabilities(), env)


def agree_cpu_bf16(every_rank: list[CpuBf16]) -> CpuBf16:
    """One answer for the job from every rank's (distributed.all_gather_objects): native only if
    every rank's CPU is, so that every rank trains in the precision rank 0 records."""
    for rank, cpu in enumerate(every_rank):
        if not cpu.native:
            return cpu if len(every_rank) == 1 else CpuBf16(False, f"rank {rank}: {cpu.reason}")
    return every_rank[0]


@dataclass(frozen=True)
class Precision:
    """The precision this run trains in (fp32, bf16 or fp16) and the reason, for its first lines
    and its "run" record."""
    name: str
    reason: str

    def line(self) -> str:
        kept = "" if self.name == "fp32" else "; BatchNorm statistics, the loss and SGD stay fp32"
        return f"Precision: {self.name} ({self.reason}){kept}"


def choose_precision(requested: str, device_type: str, gpu_bf16: bool, cpu: Optional[CpuBf16]) -> Precision:
    """--precision as given, or auto: on CPU by cpu (read_cpu_bf16, agree_cpu_bf16), on a GPU by
    resolve_precision's rule."""
    name = resolve_precision(requested, device_type, cpu.native if cpu is not None else gpu_bf16)
    if requested != "auto":
        return Precision(name, f"--precision {requested}")
    if cpu is not None:
        return Precision(name, f"auto: {cpu.reason}")
    return Precision(name, "auto, on a GPU")


def resolve_precision(requested: str, device_type: str, bf16_supported: bool) -> str:
    """auto: bf16 on GPUs that support it (fp16 with a GradScaler on older ones); on CPU bf16 where
    it computes bf16 natively (bf16_supported: read_cpu_bf16), fp32 where it would emulate it. Every rank
    of a node has the same device and CPU: local rank 0 tells."""
    if requested == "auto":
        if device_type != "cuda":
            return "bf16" if bf16_supported else "fp32"
        return CUDA_AUTO_PRECISION if bf16_supported else "fp16"
    if requested not in PRECISIONS:
        raise TrainError(f"unknown precision {requested!r}: use one of {', '.join(PRECISIONS)}",
                         Seen.BY_EVERY_RANK_OF_NODE)
    if requested == "bf16" and device_type == "cuda" and not bf16_supported:
        raise TrainError("--precision bf16 but this GPU has no bf16 support: use --precision fp16",
                         Seen.BY_EVERY_RANK_OF_NODE)
    return requested
