"""The filesystem checks: how Apptainer mounted the image, the size of /dev/shm NCCL needs, and
the dataset on disk."""

from __future__ import annotations

import os
import sys

from ddp_contract import DATASET_DIRNAME, missing_dataset_files
from ddp_contract.place import stage_dataset
from ddp_launch.doctor import image_mount
from ddp_launch.doctor.context import DoctorContext
from ddp_launch.doctor.probes import read_image_mount
from ddp_launch.doctor.report import FAIL, OK, SKIP, WARN, Check
from ddp_launch.facts import under
from ddp_launch.planner import script_refusal

# A container runtime's default /dev/shm is 64 MiB (docker run --shm-size; Kubernetes has no
# field for it, kubernetes#28272); NCCL between a node's GPUs needs more (NCCL troubleshooting,
# "Shared memory": --shm-size=1g). runai/pod.sh refuses the same size.
MIN_SHM_BYTES = 1 << 30


def check_image_mount(ctx: DoctorContext) -> Check:
    facts = read_image_mount(ctx.env, proc=under(ctx.root, "/proc"), sys_block=under(ctx.root, "/sys/block"))
    status, detail, fix = image_mount.describe(image_mount.classify(facts), facts.image)
    return Check("image mount", status, detail, fix)


def check_shm(ctx: DoctorContext) -> Check:
    info = ctx.probes.torch_info() or {}
    gpus = info.get("cuda_device_count")
    gpus = gpus if isinstance(gpus, int) else ctx.facts.gpu_device_files
    size = ctx.probes.filesystem_bytes(under(ctx.root, "/dev/shm"))
    if size is None:
        return Check("/dev/shm", SKIP, "cannot read the size of /dev/shm")
    detail = f"{size >> 20} MiB"
    if gpus > 1 and size < MIN_SHM_BYTES:
        return Check("/dev/shm", FAIL, f"{detail}, and NCCL between the {gpus} GPUs here needs at least 1 GiB",
                     "RunAI: submit with --large-shm; Docker: --shm-size=1g; Kubernetes: an emptyDir "
                     "with medium Memory at /dev/shm")
    return Check("/dev/shm", OK, detail)


def check_dataset(ctx: DoctorContext) -> Check:
    if not ctx.workload.is_ours:
        return Check("dataset", SKIP, f"the job runs {ctx.workload.describe()}: CIFAR-100 is the built-in "
                                      f"trainer's, not looked for")
    folder = os.path.join(ctx.data_dir, DATASET_DIRNAME)
    missing = missing_dataset_files(ctx.data_dir)
    if missing:
        return Check("dataset", WARN, f"{folder} lacks {', '.join(missing)}", stage_dataset(ctx.env, ctx.data_dir))
    return Check("dataset", OK, f"CIFAR-100 at {folder}")


def check_workload(ctx: DoctorContext) -> Check:
    """The user's script is a file this node's container can read, or the module is in its Python (the
    launcher's own refusal, with the bind or volume that would show it)."""
    workload = ctx.workload
    if workload.script is not None:
        if workload.script in ctx.facts.readable_files:
            return Check("workload", OK, f"script {os.path.join(ctx.facts.cwd, workload.script)} is readable here")
        return Check("workload", FAIL, script_refusal(workload.script, ctx.facts, ctx.env),
                     "make the script visible where the job runs, as the message says")
    if workload.is_ours:
        return Check("workload", OK, "the built-in trainer (python -m ddp_train)")
    if module_missing(str(workload.module)):
        return Check("workload", FAIL, f"no Python module named {workload.module!r} in {sys.executable}'s path",
                     "install it where the job's Python sees it (docs/own-script.md, adding packages: DDP_VENV or "
                     "an image of your own) or fix the name")
    return Check("workload", OK, f"module {workload.module} is importable")


def module_missing(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package is missing, or the name is not one
        return True
