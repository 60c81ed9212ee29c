"""How many GPUs this node (or this task) may use, from the scheduler's words first.

Order: the scheduler's count of GPUs on this node, its per-node request, the vendor's visible-device
variables (CUDA_VISIBLE_DEVICES; ROCR_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES), then its device files
(/dev/nvidia[0-9]*, /dev/dri/renderD*: counted by the probe, NodeFacts.gpu_device_files).
The scheduler's words come from its module (GrantVariables, each scheduler's GPU_GRANT), the vendor's
from its Accelerator (accelerators.py), picked by the site profile: this module names neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch.accelerators import Accelerator
from ddp_launch.envvars import integer, is_digits
from ddp_launch.errors import LaunchError


@dataclass(frozen=True)
class GrantVariables:
    """A scheduler's variables for the GPUs it granted, each list tried in order (its module's GPU_GRANT).

    Apptainer keeps these in the container's environment whether or not --nv / --rocm was given.
    """

    on_node: tuple[str, ...] = ()      # the count granted on this node ("4"), read before the visible devices
    per_node: tuple[str, ...] = ()     # the job's per-node request ("gpu:a100:4"), counted where on_node is unset
    device_ids: tuple[str, ...] = ()   # the node's own IDs of the granted GPUs ("0,1,2,3"), most specific first
    pod_count: tuple[str, ...] = ()    # a count read after the visible devices (a pod's GPUs)

    @property
    def counts(self) -> tuple[str, ...]:
        """The variables that hold a count of granted GPUs, in the order a message names them."""
        return self.on_node + self.pod_count

    def __add__(self, other: GrantVariables) -> GrantVariables:
        """Both schedulers' words, this one's first in each list (schedulers.gpu_grants)."""
        return GrantVariables(self.on_node + other.on_node, self.per_node + other.per_node,
                              self.device_ids + other.device_ids, self.pod_count + other.pod_count)


# Visible-device values that mean "no GPU" (SLURM writes NoDevFiles when
# the step has no GPU gres; -1 is the common manual way to hide all devices).
_NO_DEVICES = {"", "nodevfiles", "-1", "none", "void"}


@dataclass(frozen=True)
class GpuCount:
    count: int
    source: str  # the variable or probe the count came from, for --dry-run notes


def parse_gpus_per_node(value: str, name: str) -> int:
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
    """Number of devices named by a visible-device variable (indices, UUIDs or MIG ids)."""
    if value.strip().lower() in _NO_DEVICES:
        return 0
    return len([entry for entry in value.split(",") if entry.strip()])


def visible_setting(env: Mapping[str, str], accelerator: Accelerator) -> tuple[str, str] | None:
    """The first of the vendor's visible-device variables that is set, with its value."""
    for name in accelerator.visible_variables:
        if name in env:
            return name, env[name]
    return None


def count_gpus(env: Mapping[str, str], device_files: int, accelerator: Accelerator,
               grant: GrantVariables) -> GpuCount | None:
    """GPUs on this node, or None when nothing says there are any."""
    for name in grant.on_node:
        if env.get(name, "").strip():
            return GpuCount(integer(name, env[name]), name)
    for name in grant.per_node:
        if env.get(name, "").strip():
            return GpuCount(parse_gpus_per_node(env[name], name), name)
    visible = visible_setting(env, accelerator)
    if visible is not None:
        return GpuCount(visible_devices(visible[1]), visible[0])
    if device_files:
        return GpuCount(device_files, accelerator.device_label)
    return None


# -- GPUs the scheduler granted, and whether the driver can reach them -----------------------

def grant_variables(accelerator: Accelerator, grant: GrantVariables) -> tuple[str, ...]:
    """What says "this job was given GPUs", in the order a message names them."""
    return grant.on_node + grant.device_ids + accelerator.visible_variables + grant.pod_count


@dataclass(frozen=True)
class GpuGrant:
    count: int
    source: str  # the variable and its value: "CUDA_VISIBLE_DEVICES=0,1"
    accelerator: Accelerator  # whose driver must be able to use them


def granted_gpus(env: Mapping[str, str], accelerator: Accelerator, grant: GrantVariables) -> GpuGrant | None:
    """GPUs the scheduler gave this node, or None when it gave none (or said nothing)."""
    for name in grant_variables(accelerator, grant):
        value = env.get(name, "").strip()
        if not value:
            continue
        if name in grant.counts:
            count = int(value) if is_digits(value) else 0
        else:  # the scheduler's device IDs and the visible-device variables list devices: "0,1,2,3"
            count = visible_devices(value)
        if count > 0:
            return GpuGrant(count, f"{name}={value}", accelerator)
    return None


# Which GPUs were granted, by name, where a tool lists more than the grant (a node shared with other
# jobs): the scheduler's device IDs first, because they are the node's own numbering whatever the
# process sees (GrantVariables.device_ids), then the runtime's visible-device variables, whose indices
# are relative to the devices the process sees, or UUIDs (CUDA C Programming Guide, CUDA Environment
# Variables; ROCm docs, GPU isolation techniques).


@dataclass(frozen=True)
class GrantedDevices:
    variable: str                   # where the names came from: a device-ID or visible-device variable
    names: tuple[str, ...]          # as written there: indices ("3"), UUIDs ("GPU-8932f937-..."), MIG ids

    @property
    def source(self) -> str:
        return f"{self.variable}={','.join(self.names)}"


def granted_devices(env: Mapping[str, str], accelerator: Accelerator, grant: GrantVariables) -> GrantedDevices | None:
    """The granted GPUs by name, from the first variable that names any (none: nothing names them)."""
    for name in grant.device_ids + accelerator.visible_variables:
        value = env.get(name, "").strip()
        if value and value.lower() not in _NO_DEVICES:
            names = tuple(entry.strip() for entry in value.split(",") if entry.strip())
            if names:
                return GrantedDevices(name, names)
    return None


def grant_to_check(grant: GpuGrant | None, cpu_workers: object) -> GpuGrant | None:
    """The granted GPUs the driver must be able to use: none when --cpu-workers runs on CPU on purpose."""
    return grant if cpu_workers is None else None


def require_usable_gpus(grant: GpuGrant | None, driver_problem: str | None, on_kubernetes: bool,
                        gpu_device_files: int = 0) -> None:
    """Stop before launching when GPUs were granted but the runtime (CUDA, HIP) cannot see any.

    Without `apptainer run --nv` (--rocm on AMD) the container sees the scheduler's variables
    and even the device files, but not the driver's user-space libraries (Apptainer user guide,
    "GPU Support": --nv / --rocm bind them in), so torch finds no GPU and the job would quietly
    train on CPU with one gloo worker per granted GPU. With the flag on a node without the
    driver, Apptainer finds nothing to bind and says so only as a warning; the container
    cannot tell the two apart (the real Apptainer 1.4 sets nothing for --nv), but the
    host's /dev is bound either way: no device files means no driver here to bind.
    """
    if grant is None or driver_problem is None:
        return
    vendor = grant.accelerator
    flag = vendor.apptainer_flag
    if on_kubernetes:
        fix = f"check that the pod requests {vendor.kubernetes_resource} and {vendor.device_plugin} runs on the node"
    elif gpu_device_files == 0:
        fix = (f"this node has no {vendor.name.upper()} devices ({vendor.device_label}), so the host has no "
               f"driver libraries for Apptainer's {flag} to bind: not a GPU node? Check the job's partition and --gpus")
    else:
        fix = f"run the image with `apptainer run {flag}` (or `apptainer exec {flag}`)"
    raise LaunchError(f"{grant.source} granted {grant.count} GPU(s) but {vendor.runtime} cannot use any here "
                      f"({driver_problem}): {fix}, or pass --cpu-workers N to train on CPU on purpose")


def probe_driver(accelerator: Accelerator) -> str | None:
    """None when the vendor's driver initialises and sees a device, else what went wrong (the edge).

    Asks the driver itself (dlopen + cuInit/hipInit + the device count) instead of counting
    device files: Apptainer binds the host's /dev without --nv / --rocm too. Called only when
    the scheduler granted GPUs, so a CPU launch never pays for it.
    """
    import ctypes  # only here: most launches never need it

    library, init_name = accelerator.driver_library, accelerator.driver_init
    errors = accelerator.driver_errors
    try:
        driver = ctypes.CDLL(library)
    except OSError:
        return f"{library} not found: the {accelerator.name.upper()} driver libraries are not in this container"
    try:
        init, count_devices = getattr(driver, init_name), getattr(driver, accelerator.driver_count)
    except AttributeError:
        return f"{library} has no {init_name}: not a {accelerator.runtime} driver library"
    status = init(0)
    if status != 0:
        return f"{init_name} failed with {errors.get(status, status)}"
    count = ctypes.c_int(0)
    status = count_devices(ctypes.byref(count))
    if status != 0 or count.value == 0:
        return f"the driver sees no GPU ({errors.get(status, status) if status else '0 devices'})"
    return None
