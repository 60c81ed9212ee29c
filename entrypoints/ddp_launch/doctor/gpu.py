"""The GPU checks: the GPUs torch sees against the grant, their health counters, torch itself and
the kernel driver against the image's runtime; the vendor's words from ctx.accelerator."""

from __future__ import annotations

import functools
import re
from typing import Optional, Tuple

from ddp_contract.place import in_a_pod
from ddp_launch.doctor import gpu_health
from ddp_launch.doctor.context import DoctorContext, container_runtime
from ddp_launch.doctor.probes import driver_version_text
from ddp_launch.doctor.report import FAIL, OK, SKIP, WARN, Check
from ddp_launch.envvars import integer
from ddp_launch.errors import LaunchError
from ddp_launch.gpus import granted_devices, granted_gpus


def check_gpus(ctx: DoctorContext) -> Check:
    info = ctx.probes.torch_info() or {}
    vendor = ctx.accelerator
    visible = info.get("cuda_device_count")
    source = "torch.cuda.device_count()"  # ROCm builds of torch answer through torch.cuda too
    if not isinstance(visible, int):
        visible, source = ctx.facts.gpu_device_files, vendor.device_label
    # The message names the variable the count came from: a pod has no SLURM variables.
    granted_from = next((name for name in ctx.gpu_grant.counts if ctx.env.get(name)), None)
    try:
        granted = integer(granted_from, ctx.env[granted_from]) if granted_from else None
    except LaunchError as error:
        return Check("gpus", FAIL, str(error), f"give {granted_from} a whole number of GPUs")
    runtime = container_runtime(ctx)
    # What brings the GPUs into this container: in a pod its resource request and the vendor's device
    # plugin (gpus.require_usable_gpus says the same), on a cluster node the runtime's GPU flag.
    if in_a_pod(ctx.env):
        enter = (f"check that the pod requests {vendor.kubernetes_resource} (RunAI: -g N) and "
                 f"{vendor.device_plugin} runs on its node")
        request = f"request GPUs for the pod ({vendor.kubernetes_resource}; RunAI: -g N)"
    else:
        enter = (f"run with `{runtime} exec {vendor.apptainer_flag}` (or `{runtime} run {vendor.apptainer_flag}`) "
                 "so the GPUs enter the container")
        request = f"on a GPU node, add {vendor.apptainer_flag} to {runtime}"
    if granted and visible == 0 and ctx.cpu_workers is not None:
        # The launcher takes --cpu-workers as training on CPU on purpose and leaves the granted GPUs
        # alone (gpus.grant_to_check): the preflight must not fail every node for what it accepts.
        return Check("gpus", WARN, f"0 GPUs visible ({source}), {granted} granted; the workers run on CPU as "
                                   f"{ctx.cpu_workers.source}={ctx.cpu_workers.value} asks",
                     f"to train on the GPUs, unset {ctx.cpu_workers.source} and {enter}")
    if granted and visible == 0:
        return Check("gpus", FAIL, f"0 GPUs visible ({source}) but {granted} granted", enter)
    if granted is not None and visible != granted:
        return Check("gpus", WARN, f"{visible} GPUs visible ({source}), {granted} granted",
                     f"check {vendor.visible_variables[0]} and the job's --gpus-per-node" if not in_a_pod(ctx.env)
                     else f"check {vendor.visible_variables[0]} and the pod's {vendor.kubernetes_resource} request")
    if visible == 0:
        return Check("gpus", WARN, "no GPUs visible; training will run on CPU", request)
    granted_note = f", {granted} granted" if granted is not None else ""
    return Check("gpus", OK, f"{visible} GPUs visible ({source}){granted_note}")


def check_gpu_health(ctx: DoctorContext) -> Check:
    """The health counters of the GPUs granted here, by the vendor's rules (containers/sites/accelerators/
    <vendor>.json); a state (a slowdown, a temperature) seen alone is read again before it fails the node."""
    health = ctx.accelerator.health
    found = ctx.probes.which(health.commands[0].argv[0]) is not None

    def read() -> list:
        return [gpu_health.CommandOutput(command.argv, *ctx.probes.read_command(command.argv))
                for command in (health.commands if found else ())]

    granted = granted_gpus(ctx.env, ctx.accelerator, ctx.gpu_grant)
    devices = granted_devices(ctx.env, ctx.accelerator, ctx.gpu_grant)
    judge = functools.partial(gpu_health.assess, ctx.accelerator, granted, found,
                              runtime=container_runtime(ctx), devices=devices, node=ctx.node)
    first = read()
    verdict = judge(first)
    if verdict.recheck:
        ctx.probes.sleep(gpu_health.RECHECK_AFTER_S)
        verdict = judge(first, again=read())
    return Check(gpu_health.NAME, verdict.status, verdict.detail, verdict.fix, verdict.evidence)


def check_torch(ctx: DoctorContext) -> Check:
    info = ctx.probes.torch_info()
    if info is None:
        return Check("torch", FAIL, "torch cannot be imported", "use an image with PyTorch (the NGC base) or pip install torch")
    parts = [f"torch {info.get('version')}"]
    if info.get("cuda"):
        parts.append(f"CUDA {info['cuda']}")
    if info.get("hip"):
        parts.append(f"HIP {info['hip']}")
    if info.get("nccl"):
        parts.append(f"{ctx.accelerator.collective} {info['nccl']}")
    return Check("torch", OK, ", ".join(parts))


def parse_driver_version(text: str) -> Optional[Tuple[int, int]]:
    """The kernel driver's major.minor: NVIDIA's /proc/driver/nvidia/version line ("Kernel Module
    550.54.15"), or a file that holds the version alone (/sys/module/amdgpu/version: "6.8.5")."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+)\.(\d+)", text) or re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_cuda_driver(ctx: DoctorContext) -> Check:
    """The kernel driver against the image's runtime (CUDA, HIP), where a minimum is published."""
    vendor = ctx.accelerator
    runtime, name = vendor.runtime, f"{vendor.runtime} driver"
    driver = parse_driver_version(driver_version_text(ctx.root, vendor))
    if driver is None:
        return Check(name, SKIP, f"no {vendor.name.upper()} driver ({vendor.driver_version_file})")
    info = ctx.probes.torch_info() or {}
    image = ctx.env.get(f"{runtime}_VERSION") or info.get(runtime.lower())
    if not image:
        return Check(name, OK, f"driver {driver[0]}.{driver[1]}; image {runtime} unknown")
    major = int(str(image).split(".")[0])
    needed = vendor.driver_minimum.get(major)  # where the vendor publishes one (accelerator data)
    if needed and driver[0] < needed:
        return Check(name, WARN, f"driver {driver[0]}.{driver[1]} is older than {runtime} {image} needs (>= {needed})",
                     vendor.driver_too_old_fix or f"use an image built for the host's {runtime}")
    return Check(name, OK, f"driver {driver[0]}.{driver[1]} runs the image's {runtime} {image}")
