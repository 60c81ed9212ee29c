"""The GPU fast path's setup: torch.compile with a persistent cache, DDP's gradient buckets and
hook, and a warm-up pass (compile, autotune, CUDA-graph recording) that leaves training unchanged.
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, MutableMapping, Optional, Protocol, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

from ddp_train.fast import cudagraph_report, levers
from ddp_train.checkpoint import rng_state, set_rng_state
from ddp_train.errors import Seen, TrainError

if TYPE_CHECKING:
    from ddp_train.resolve import Decisions

COMPILE_CACHE_DIRNAME = "compile-cache"
INDUCTOR_CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"


def compile_cache_dir(configured: str, run_dir: str | Path, env: Mapping[str, str]) -> Path:
    """Where inductor keeps compiled kernels: --compile-cache-dir > $TORCHINDUCTOR_CACHE_DIR >
    <run-dir>/compile-cache.

    Inductor's default is /tmp/torchinductor_<user>, which a cluster wipes at the end of every
    job, so each requeued job would compile again (minutes for the full model). The run directory is on
    the shared filesystem, visible from every node, and survives the requeues of its own run;
    point several runs at one directory to share it. (Triton's kernels follow: inductor puts
    them under this directory unless TRITON_CACHE_DIR is set.)
    """
    if configured:
        return Path(configured)
    if env.get(INDUCTOR_CACHE_VARIABLE):
        return Path(env[INDUCTOR_CACHE_VARIABLE])
    return Path(run_dir) / COMPILE_CACHE_DIRNAME


def use_compile_cache(path: Path, environ: MutableMapping[str, str]) -> None:
    """Inductor reads the variable when it first compiles, so this must run before that."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a --run-dir that is a file, a read-only or full file system
        raise TrainError(f"the compile cache {path} cannot be created ({exc.strerror}): pass a writable "
                         f"--run-dir or --compile-cache-dir", Seen.BY_EVERY_RANK_OF_NODE) from None
    environ[INDUCTOR_CACHE_VARIABLE] = str(path)


def tune_backends(device: torch.device) -> None:
    """cuDNN picks the fastest convolution per shape (every step has the same shapes), and fp32
    matmuls may use TF32 tensor cores."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")


def wrap_ddp(model: nn.Module, device: torch.device, bucket_cap_mb: float,
             grad_compression: str, on_bucket: Optional[Callable[[], None]] = None) -> DistributedDataParallel:
    """DDP with gradients as views of its buckets (no copy into the all-reduce buffers).

    on_bucket is called as each gradient bucket is handed to the all-reduce (the heartbeat
    and the step clock: safety/heartbeat.py, safety/steptime.py), from a comm hook around the reduction.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        gradient_as_bucket_view=True, bucket_cap_mb=bucket_cap_mb)
    if grad_compression == "bf16":
        hook = default_hooks.bf16_compress_hook
    elif grad_compression == "none":
        hook = default_hooks.allreduce_hook
    else:
        raise TrainError(f"--grad-compression {grad_compression!r}: use none or bf16")
    if on_bucket is not None:
        @functools.wraps(hook)  # DDP's record names the hook (bucket_layout): the wrapped one's name
        def marked(state, bucket):  # unannotated: DDP checks annotations, and ours are strings here
            on_bucket()
            return hook(state, bucket)
        ddp.register_comm_hook(None, marked)
    elif hook is not default_hooks.allreduce_hook:
        ddp.register_comm_hook(None, hook)
    return ddp


@dataclass(frozen=True)
class FastModel:
    """The model as the training step calls it: DDP-wrapped in a world of several, maybe compiled."""
    ddp: nn.Module  # the DistributedDataParallel wrapper, or the model itself in a world of one
    forward: Callable[[torch.Tensor], torch.Tensor]
    compiled: bool
    compile_mode: str  # "eager" when not compiled
    cuda_graphs: bool  # asked for; whether inductor kept them is graph_state's answer
    skips: Optional[cudagraph_report.SkipWatch] = None  # inductor's skip messages, from before the compile
    levers: tuple[str, ...] = ()  # inductor levers set before the compile (levers.py)
    bn_kernels: str = "torch"  # who computes BatchNorm in training (--bn-kernels, resolved)

    def describe(self) -> str:
        """The compile mode, its levers and our BatchNorm kernels, as the warm-up line says them."""
        ours = ("triton BatchNorm",) if self.bn_kernels == "triton" else ()
        return " + ".join((self.compile_mode, *self.levers, *ours))

    def graph_state(self, device: torch.device) -> cudagraph_report.GraphState:
        """Whether the compiled step runs as a CUDA graph here: ask after the warm-up."""
        return cudagraph_report.observe(device.type, device.index, self.compiled, self.compile_mode, self.skips)


def accelerate(model: nn.Module, decided: Decisions, device: torch.device,
               on_bucket: Optional[Callable[[], None]] = None) -> FastModel:
    """The model as decided (resolve.py), on tuned backends (tune_backends): DDP-wrapped in a world of
    several, the levers set, compiled."""
    tune_backends(device)
    ddp: nn.Module = model
    if decided.world_size > 1:  # the process group is up: train.run started it
        check_compression_backend(decided.config.grad_compression, device)
        ddp = wrap_ddp(model, device, decided.config.bucket_cap_mb, decided.config.grad_compression, on_bucket)
    levers.apply(decided.levers)
    skips = cudagraph_report.SkipWatch.start() if decided.compiled else None
    forward = torch.compile(ddp, mode=decided.compile_mode) if decided.compiled else ddp
    return FastModel(ddp, forward, decided.compiled, decided.compile_mode, decided.cuda_graphs, skips, decided.levers,
                     decided.bn_kernels)


def bucket_layout(ddp: nn.Module) -> Optional[dict[str, Any]]:
    """DDP's own record of its gradient buckets (benchmarks/ddp_buckets.py shows their contents);
    None for a model DDP does not wrap."""
    if not isinstance(ddp, DistributedDataParallel):
        return None
    data = ddp._get_ddp_logging_data()
    return {"bucket_sizes": str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or ""),
            "bucket_cap_bytes": int(data.get("bucket_cap_bytes", 0)),
            "comm_hook": data.get("comm_hook") or None}


def check_compression_backend(grad_compression: str, device: torch.device) -> None:
    """bf16_compress_hook all-reduces bf16 tensors on the model's device; refuse a backend that
    cannot (checked once here rather than as a C++ error inside the first backward)."""
    if grad_compression == "bf16" and dist.is_initialized() and dist.get_world_size() > 1:
        probe = torch.ones(1, dtype=torch.bfloat16, device=device)
        try:
            dist.all_reduce(probe)
        except RuntimeError as exc:
            raise TrainError(f"--grad-compression bf16: the {dist.get_backend()} backend cannot "
                             f"all-reduce bf16 ({str(exc).splitlines()[0]}); use --grad-compression none") from None


class Stateful(Protocol):
    """What the warm-up puts back: a learner (learner.Learner), or a module, optimizer, scaler."""

    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> Any: ...


def warm_up(step: Callable[[], Any], passes: int, parts: Sequence[Stateful], device: torch.device) -> float:
    """Run `step` (a full training step on a real batch) `passes` times, then put `parts` (the learner:
    weights, BatchNorm statistics, optimizer, scaler, EMA) and the RNG back as they were: the run
    trains exactly as without it, and compile, cuDNN autotuning and CUDA-graph recording happen off
    the clock. Returns the seconds it took (the run's setup time)."""
    if passes <= 0:
        return 0.0
    started = time.perf_counter()
    # state_dict() returns live references: copy them, or the restore would be a no-op.
    saved = [copy.deepcopy(part.state_dict()) for part in parts]
    saved_rng = rng_state(device)
    for _ in range(passes):
        step()
    with torch.no_grad():  # copies in place: DDP, compile and graphs keep their pointers
        for part, state in zip(parts, saved):
            part.load_state_dict(state)
    set_rng_state(saved_rng, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


def warmup_passes(device: torch.device, compiled: bool, cuda_graphs: bool) -> int:
    """One pass compiles and autotunes; CUDA-graph trees record on the call after their first
    (warm-up) run, so graphs need a second. Eager CPU has nothing to warm."""
    if cuda_graphs and device.type == "cuda":
        return 3
    return 1 if compiled or device.type == "cuda" else 0
