"""What this node's workers will load, read as the doctor reads libraries: the stack the known-issues rows
(ddp_contract.known_issues) are matched against, and the settings NCCL and libfabric will see.

Each version comes from the library ld.so finds first on the workers' path, asked the way provenance
asks the loaded copy (src/ddp_train/safety/provenance.py): NCCL and RCCL by ncclGetVersion (torch's own
answer first, where torch can ask it), libfabric by fi_version, the OFI plugin by the package string it
logs at start-up, libcxi by its file's version; then torch, the kernel driver, the image's base (its
label), and the site's GPU vendor and model.
"""

from __future__ import annotations

import json
import os
import re
from typing import Dict, Mapping, Optional, Tuple

from ddp_contract import known_issues, nccl_conf
from ddp_launch.doctor.context import DoctorContext
from ddp_launch.doctor.libraries import loaded_first
from ddp_launch.doctor.probes import driver_version_text
from ddp_launch.facts import read_text, under

_FILE_VERSION = re.compile(r"\.so\.(\d+(?:\.\d+)+)$")
plugin_version = known_issues.plugin_version


def file_version(path: str) -> Optional[str]:
    """The version the real file name carries (libcxi.so.1.5.0 -> 1.5.0), as provenance reads it."""
    found = _FILE_VERSION.search(os.path.basename(os.path.realpath(path)))
    return found.group(1) if found else None


def _number(text: str) -> Optional[str]:
    """The version in a load probe's answer ("NCCL 2.27.7", "libfabric 2.3"), or None."""
    found = re.search(r"(\d+(?:\.\d+)+)\s*$", text or "")
    return found.group(1) if found else None


def _loaded(ctx: DoctorContext, pattern: str, kind: str) -> Tuple[Optional[str], Optional[str]]:
    """(version, path) of the library ld.so finds first, loaded to ask it; (None, path or None) otherwise."""
    path = loaded_first(ctx, pattern)
    if path is None:
        return None, None
    try:
        return _number(ctx.probes.load_library(under(ctx.root, path), kind)), path
    except OSError:
        return None, path


def image_base(root: str) -> Optional[str]:
    """The image's base, as gpu.def labels it (org.opencontainers.image.base.name), or None."""
    try:
        labels = json.loads(read_text(root, known_issues.IMAGE_LABELS_FILE) or "{}")
    except ValueError:
        return None
    value = labels.get(known_issues.BASE_LABEL) if isinstance(labels, dict) else None
    return str(value) if value else None


def workers_env(ctx: DoctorContext) -> Dict[str, str]:
    """The environment the workers start with: this one, changed as the launcher plans."""
    changes = ctx.launch.changes if ctx.launch is not None else ctx.fabric.changes
    env = dict(ctx.env)
    env.update((change.name, change.value) for change in changes)
    return env


def collective(ctx: DoctorContext) -> Tuple[Optional[str], str]:
    """(version, where) of the NCCL or RCCL the workers load: torch's answer where it gives one (it asked
    the copy it loaded), else the library ld.so finds first for them."""
    info = ctx.probes.torch_info() or {}
    if info.get("nccl"):
        return str(info["nccl"]), f"torch's {ctx.accelerator.collective}"
    version, path = _loaded(ctx, re.escape(ctx.accelerator.collective_library), "nccl")
    return version, path or f"no {ctx.accelerator.collective_library} found"


def conf_lines(ctx: DoctorContext) -> Tuple[nccl_conf.ConfLine, ...]:
    """The lines of the NCCL config files the workers' NCCL reads, with their effect there."""
    env = workers_env(ctx)
    return nccl_conf.settings(env, collective(ctx)[0], ctx.root)


def node_stack(ctx: DoctorContext) -> known_issues.Stack:
    versions: Dict[str, Optional[str]] = {}
    where: Dict[str, str] = {}
    versions["nccl"], where["nccl"] = collective(ctx)
    plugin = loaded_first(ctx, re.escape(ctx.accelerator.net_plugin))
    versions["aws-ofi-nccl"] = plugin_version(under(ctx.root, plugin)) if plugin else None
    where["aws-ofi-nccl"] = plugin or f"no {ctx.accelerator.net_plugin} found"
    versions["libfabric"], found = _loaded(ctx, r"libfabric\.so\.1", "libfabric")
    where["libfabric"] = found or "no libfabric.so.1 found"
    cxi = loaded_first(ctx, r"libcxi\.so\.1")
    versions["libcxi"] = file_version(under(ctx.root, cxi)) if cxi else None
    where["libcxi"] = cxi or "no libcxi.so.1 found"
    info = ctx.probes.torch_info() or {}
    versions["torch"] = str(info["version"]) if info.get("version") else None
    versions["driver"] = known_issues.driver_version(driver_version_text(ctx.root, ctx.accelerator))
    versions["base_image"] = image_base(ctx.root)
    versions["accelerator"] = ctx.accelerator.name
    versions["gpu"] = ctx.profile.gpu if ctx.profile else None
    versions["machine"] = ctx.facts.machine
    settings: Mapping[str, str] = {**nccl_conf.applied(conf_lines(ctx)), **workers_env(ctx)}
    return known_issues.Stack(versions, where, settings)
