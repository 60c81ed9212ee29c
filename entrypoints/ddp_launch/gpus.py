"""How many GPUs this node (or this task) may use, from the scheduler's words first.

Order: SLURM_GPUS_ON_NODE, SLURM_GPUS_PER_NODE, CUDA_VISIBLE_DEVICES, then the
/dev/nvidia[0-9]* device files (counted by the probe: NodeFacts.gpu_device_files).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch.envvars import integer, is_digits
from ddp_launch.errors import LaunchError

# CUDA_VISIBLE_DEVICES values that mean "no GPU" (SLURM writes NoDevFiles when
# the step has no GPU gres; -1 is the common manual way to hide all devices).
_NO_DEVICES = {"", "nodevfiles", "-1", "none", "void"}


@dataclass(frozen=True)
class GpuCount:
    count: int
    source: str  # the variable or probe the count came from, for --dry-run notes


def parse_gpus_per_node(value: str, name: str = "SLURM_GPUS_PER_NODE") -> int:
    """GPUs from --gpus-per-node forms: '4', 'gpu:4', 'gpu:a100:4', 'a100:2,v100:2'."""
    total = 0
    for entry in value.split(","):
        count = entry.split("(")[0].rsplit(":", 1)[-1].strip()
        if not is_digits(count):
            raise LaunchError(
                f"{name}={value!r} is not a GPU count: expected '4', 'gpu:4' or 'gpu:a100:4'"
            )
        total += int(count)
    return total


def visible_devices(value: str) -> int:
    """Number of devices named by CUDA_VISIBLE_DEVICES (indices, UUIDs or MIG ids)."""
    if value.strip().lower() in _NO_DEVICES:
        return 0
    return len([entry for entry in value.split(",") if entry.strip()])


def count_gpus(env: Mapping[str, str], device_files: int) -> GpuCount | None:
    """GPUs on this node, or None when nothing says there are any."""
    if env.get("SLURM_GPUS_ON_NODE", "").strip():
        return GpuCount(integer("SLURM_GPUS_ON_NODE", env["SLURM_GPUS_ON_NODE"]), "SLURM_GPUS_ON_NODE")
    if env.get("SLURM_GPUS_PER_NODE", "").strip():
        return GpuCount(parse_gpus_per_node(env["SLURM_GPUS_PER_NODE"]), "SLURM_GPUS_PER_NODE")
    if "CUDA_VISIBLE_DEVICES" in env:
        return GpuCount(visible_devices(env["CUDA_VISIBLE_DEVICES"]), "CUDA_VISIBLE_DEVICES")
    if device_files:
        return GpuCount(device_files, "/dev/nvidia[0-9]*")
    return None


# -- GPUs the scheduler granted, and whether the driver can reach them -----------------------

# What says "this job was given GPUs", in the order a message names them. Apptainer keeps
# these in the container's environment whether or not --nv was given.
GRANT_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "RUNAI_NUM_OF_GPUS")


@dataclass(frozen=True)
class GpuGrant:
    count: int
    source: str  # "SLURM_GPUS_ON_NODE=4"


def granted_gpus(env: Mapping[str, str]) -> GpuGrant | None:
    """GPUs the scheduler gave this node, or None when it gave none (or said nothing)."""
    for name in GRANT_VARIABLES:
        value = env.get(name, "").strip()
        if not value:
            continue
        if name in ("SLURM_GPUS_ON_NODE", "RUNAI_NUM_OF_GPUS"):
            count = int(value) if is_digits(value) else 0
        else:  # SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES list devices: "0,1,2,3"
            count = visible_devices(value)
        if count > 0:
            return GpuGrant(count, f"{name}={value}")
    return None


def grant_to_check(grant: GpuGrant | None, cpu_workers: object) -> GpuGrant | None:
    """The granted GPUs the CUDA driver must be able to use: none when --cpu-workers runs on CPU on purpose."""
    return grant if cpu_workers is None else None


def require_usable_gpus(grant: GpuGrant | None, driver_problem: str | None, on_kubernetes: bool,
                        gpu_device_files: int = 0) -> None:
    """Stop before launching when GPUs were granted but CUDA cannot see any.

    Without `apptainer run --nv` the container sees the scheduler's variables and even
    /dev/nvidia*, but not the driver's user-space libraries (Apptainer user guide, "GPU
    Support": --nv binds them in), so torch finds no GPU and the job would quietly train
    on CPU with one gloo worker per granted GPU. With --nv on a node without the NVIDIA
    driver, Apptainer finds nothing to bind and says so only as a warning; the container
    cannot tell the two apart (the real Apptainer 1.4 sets nothing for --nv), but the
    host's /dev is bound either way: no /dev/nvidia* means no driver here to bind.
    """
    if grant is None or driver_problem is None:
        return
    if on_kubernetes:
        fix = "check that the pod requests nvidia.com/gpu and the NVIDIA device plugin runs on the node"
    elif gpu_device_files == 0:
        fix = ("this node has no NVIDIA devices (/dev/nvidia*), so the host has no driver libraries for "
               "Apptainer's --nv to bind: not a GPU node? Check the job's partition and --gpus")
    else:
        fix = "run the image with `apptainer run --nv` (or `apptainer exec --nv`)"
    raise LaunchError(f"{grant.source} granted {grant.count} GPU(s) but CUDA cannot use any here "
                      f"({driver_problem}): {fix}, or pass --cpu-workers N to train on CPU on purpose")


# CUresult values worth naming (CUDA driver API, cuda.h).
_CU_ERRORS = {100: "CUDA_ERROR_NO_DEVICE", 35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
              803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
              999: "CUDA_ERROR_UNKNOWN"}


def probe_cuda_driver(library: str = "libcuda.so.1") -> str | None:
    """None when the CUDA driver initialises and sees a device, else what went wrong (the edge).

    Asks the driver itself (dlopen + cuInit + cuDeviceGetCount) instead of counting
    /dev/nvidia*: Apptainer binds the host's /dev without --nv too. Called only when the
    scheduler granted GPUs, so a CPU launch never pays for it.
    """
    import ctypes  # only here: most launches never need it

    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return f"{library} not found: the NVIDIA driver libraries are not in this container"
    try:
        init, count_devices = cuda.cuInit, cuda.cuDeviceGetCount
    except AttributeError:
        return f"{library} has no cuInit: not a CUDA driver library"
    status = init(0)
    if status != 0:
        return f"cuInit failed with {_CU_ERRORS.get(status, status)}"
    count = ctypes.c_int(0)
    status = count_devices(ctypes.byref(count))
    if status != 0 or count.value == 0:
        return f"the driver sees no GPU ({_CU_ERRORS.get(status, status) if status else '0 devices'})"
    return None
