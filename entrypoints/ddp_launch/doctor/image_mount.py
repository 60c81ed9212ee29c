"""How Apptainer mounted the image this process runs in: the doctor's "image mount" check.

Apptainer runs a SIF one of three ways (Apptainer admin guide, "Installing Apptainer",
setuid vs unprivileged; user guide, "Unprivileged image mounts"):
- the kernel's squashfs driver on a loop device (setuid installations): fast for any
  number of readers;
- squashfuse (unprivileged installations where /dev/fuse is usable): one FUSE process
  per container serves every read, which slows jobs with many processes per node badly
  (apptainer#665: a 24 min job took 2 h 50 min);
- a temporary sandbox: the SIF unpacked into a directory before each start (unprivileged,
  without squashfuse): slow to start, then native speed.
Inside, "/" is an overlay over the session's rootfs either way, so the mount table does not
say which. What does, seen from inside (no PID namespace by default, and the host's /sys):
Apptainer 1.4 starts `squashfuse_ll ... /var/lib/apptainer/mnt/session/rootfs` as a child
of the container's "Apptainer runtime parent" process, our ancestor; a kernel mount has a
loop device whose backing_file is the SIF. ddp_launch.doctor.probes reads those facts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

KERNEL, SQUASHFUSE, TEMPORARY_SANDBOX, SANDBOX, NOT_APPTAINER, UNKNOWN = (
    "kernel squashfs", "squashfuse", "temporary sandbox", "sandbox directory", "not in Apptainer", "unknown")
# Apptainer user guide, "Environment and Metadata": set in every container it starts.
CONTAINER_VARIABLES = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")
RUNTIME_PARENT = "Apptainer runtime parent"
SQUASHFUSE_FIX = ("export APPTAINER_UNSQUASH=1 before sbatch (apptainer run --unsquash: a temporary "
                  "sandbox per node), run from a sandbox on local disk (apptainer build --sandbox "
                  "$TMPDIR/train train.sif), or ask for Apptainer's setuid mode (kernel squashfs); "
                  "many readers are slow through FUSE (apptainer#665)")


@dataclass(frozen=True)
class ImageMountFacts:
    image: Optional[str]                 # $APPTAINER_CONTAINER: None outside Apptainer
    image_is_dir: bool                   # a sandbox directory, not a SIF
    runtime_parent_seen: bool            # an ancestor is Apptainer's runtime parent (same PID namespace)
    squashfuse_children: int             # squashfuse processes started by that ancestor
    loop_backing_files: Tuple[str, ...]  # /sys/block/loop*/loop/backing_file


def classify(facts: ImageMountFacts) -> str:
    if facts.image is None:
        return NOT_APPTAINER
    if facts.image_is_dir:
        # --unsquash / APPTAINER_UNSQUASH: Apptainer 1.4 runs $TMPDIR/rootfs-NNN/root.
        parent = os.path.basename(os.path.dirname(facts.image.rstrip("/")))
        if os.path.basename(facts.image.rstrip("/")) == "root" and parent.startswith("rootfs-"):
            return TEMPORARY_SANDBOX
        return SANDBOX
    if facts.squashfuse_children:
        return SQUASHFUSE
    if os.path.realpath(facts.image) in facts.loop_backing_files or facts.image in facts.loop_backing_files:
        return KERNEL
    if facts.runtime_parent_seen:
        return TEMPORARY_SANDBOX
    return UNKNOWN  # in a PID namespace (--pid, --containall): the processes are out of sight


def describe(kind: str, image: Optional[str]) -> Tuple[str, str, str]:
    """(status, detail, fix) for the doctor."""
    if kind == NOT_APPTAINER:
        return "SKIP", "not in an Apptainer container", ""
    if kind == SQUASHFUSE:
        return ("WARN", f"{image} is mounted by squashfuse (unprivileged Apptainer): one FUSE process "
                        "serves every read, slow with many processes per node, and SLURM's stop signal "
                        "(USR2, TERM) reaches it too: the workers then die of SIGBUS before any checkpoint",
                SQUASHFUSE_FIX)
    if kind == TEMPORARY_SANDBOX:
        return ("OK", f"{image} was unpacked to a temporary sandbox (no squashfuse, no kernel "
                      "squashfs mount): each start pays for the unpacking", "")
    if kind == UNKNOWN:
        return "SKIP", f"{image}: how it is mounted is out of sight here (a PID namespace?)", ""
    return "OK", f"{image}: {kind}", ""
