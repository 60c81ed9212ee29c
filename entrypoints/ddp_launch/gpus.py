"""How many GPUs this node (or this task) may use, from the scheduler's words first.

Order: SLURM_GPUS_ON_NODE, SLURM_GPUS_PER_NODE, CUDA_VISIBLE_DEVICES, then the
/dev/nvidia[0-9]* device files (counted at the edge by count_device_files).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import NamedTuple

from ddp_launch.errors import LaunchError

# CUDA_VISIBLE_DEVICES values that mean "no GPU" (SLURM writes NoDevFiles when
# the step has no GPU gres; -1 is the common manual way to hide all devices).
_NO_DEVICES = {"", "nodevfiles", "-1", "none", "void"}
_DEVICE_FILE = re.compile(r"nvidia[0-9]+")


class GpuCount(NamedTuple):
    count: int
    source: str  # the variable or probe the count came from, for --dry-run notes


def parse_count(name: str, value: str) -> int:
    """A non-negative integer from an environment variable, or a LaunchError naming it."""
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        raise LaunchError(f"{name}={value!r} is not a non-negative integer: unset it or fix its value")
    return int(text)


def parse_gpus_per_node(value: str, name: str = "SLURM_GPUS_PER_NODE") -> int:
    """GPUs from --gpus-per-node forms: '4', 'gpu:4', 'gpu:a100:4', 'a100:2,v100:2'."""
    total = 0
    for entry in value.split(","):
        count = entry.split("(")[0].rsplit(":", 1)[-1].strip()
        if not (count.isascii() and count.isdigit()):
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
        return GpuCount(parse_count("SLURM_GPUS_ON_NODE", env["SLURM_GPUS_ON_NODE"]),
                        "SLURM_GPUS_ON_NODE")
    if env.get("SLURM_GPUS_PER_NODE", "").strip():
        return GpuCount(parse_gpus_per_node(env["SLURM_GPUS_PER_NODE"]), "SLURM_GPUS_PER_NODE")
    if "CUDA_VISIBLE_DEVICES" in env:
        return GpuCount(visible_devices(env["CUDA_VISIBLE_DEVICES"]), "CUDA_VISIBLE_DEVICES")
    if device_files:
        return GpuCount(device_files, "/dev/nvidia[0-9]*")
    return None


def count_device_files(root: str = "/") -> int:
    """Count /dev/nvidia0, /dev/nvidia1, ... under root (not nvidiactl, nvidia-uvm)."""
    try:
        names = os.listdir(os.path.join(root, "dev"))
    except OSError:
        return 0
    return sum(1 for name in names if _DEVICE_FILE.fullmatch(name))
