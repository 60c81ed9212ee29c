"""Fabric environment for NCCL/libfabric: Slingshot (CXI), InfiniBand/RoCE, Ethernet, each a module of
this package (registry.py lists them, common.py's Fabric says what each has).

plan_fabric(request, facts, data) is pure: the node was read once into NodeFacts (facts.py),
the files once into FabricData (defaults.py, read at the edge: cli, doctor), and the values
come from that data with their sources. Each variable is layered as:

    fabric default  <  site profile  <  the user's environment

each overriding the one before. Fabric defaults are containers/sites/fabrics/<fabric>.json
(then common.json, for every fabric); site profiles are containers/sites/<site>.json; a
variable already in the environment is never changed (a "kept" finding says so), except
by an explicit flag (--nccl-debug). A site profile's null value leaves a variable unset that a
fabric default would set (an "unset" finding says why). Every change carries its reason for --dry-run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddp_contract import EXPECT_FABRIC_VAR, LOG_DIR_VAR, REQUIRE_FABRIC_VAR
from ddp_contract.fabrics import AUTO
from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts
from ddp_launch.fabric import ethernet
from ddp_launch.fabric.common import EnvBuilder, FabricJob, FabricRequest
from ddp_launch.fabric.defaults import COMMON, FabricData, rdzv_get_disabled
from ddp_launch.fabric.infiniband import choose_roce_device
from ddp_launch.fabric.libpaths import library_path_changes, search_directories
from ddp_launch.fabric.registry import fabric_named, registered
from ddp_launch.plan import SITE_PROFILE, EnvChange, Finding
from ddp_launch.sites import SiteProfile

__all__ = ("NCCL_DEBUG_LEVELS", "FabricPlan", "FabricRequest", "detect_fabric", "directories_to_probe",
           "ethernet_requested", "nccl_debug_file", "plan_fabric")

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
# --dry-run prints warnings and errors alike as "warning:": the launcher still runs with
# the user's value; doctor reads the severity and FAILs an error.
_NOTE_PREFIX = {"info": "", "warning": "warning: ", "error": "warning: "}


@dataclass(frozen=True)
class FabricPlan:
    fabric: str                         # its NAME: slingshot | infiniband | ethernet (ddp_contract.fabrics)
    changes: tuple[EnvChange, ...]
    findings: tuple[Finding, ...]       # kept user values, warnings: for --dry-run and doctor

    @property
    def notes(self) -> tuple[str, ...]:
        """The findings as --dry-run prints them."""
        return tuple(_NOTE_PREFIX[f.severity] + f.text for f in self.findings)


def directories_to_probe(data: FabricData) -> tuple[str, ...]:
    """The container directories whose existence plan_fabric needs (the site's library paths).

    Nothing for a profile that could not be read: plan_fabric raises its error, in its turn.
    """
    if not isinstance(data.profile, SiteProfile):
        return ()
    return search_directories(data.profile)


def detect_fabric(facts: NodeFacts) -> str:
    """The first fabric in detection order that the node has: Slingshot if CXI devices exist, else
    InfiniBand/RoCE if RDMA devices exist, else Ethernet (ddp_contract.fabrics.FABRICS)."""
    return next(fabric.NAME for fabric in registered() if fabric.detect(facts))


def _high_speed_devices() -> str:
    """Where a node shows a high-speed fabric, for --require-fabric's error: "a, b or c"."""
    devices = [device for fabric in registered() if fabric.HIGH_SPEED for device in fabric.DEVICES]
    return " or ".join(filter(None, (", ".join(devices[:-1]), devices[-1])))


def ethernet_requested(request: FabricRequest, profile: SiteProfile | None) -> str | None:
    """Why this job must use Ethernet sockets though the node has a faster fabric, if it must.

    Nodes often carry an InfiniBand HCA that the job may not use; NCCL_IB_DISABLE=1 then makes
    NCCL fall back to IP sockets (NCCL's environment variables page, NCCL_IB_DISABLE:
    https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-disable).
    Then NCCL needs its socket interface chosen per node, and sockets are what the transport
    check must expect.
    """
    if request.gloo:
        return "CPU workers (gloo over TCP)"
    if request.env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return "NCCL_IB_DISABLE=1"
    if profile is not None and profile.fabric == ethernet.NAME:
        return f"site {profile.name} says ethernet"
    return None


def nccl_debug_file(request: FabricRequest) -> str:
    """One NCCL log per process (%h host, %p pid), where the transport check looks."""
    env = request.env
    # DDP_LAUNCH_LOG_DIR, when exported, has always named this place, even beside --log-dir.
    directory = env[LOG_DIR_VAR] if LOG_DIR_VAR in env else request.log_dir
    directory = directory or env.get("TMPDIR") or "/tmp"
    return os.path.join(directory, f"nccl-{request.job_name or 'local'}.%h.%p.log")


def _observe_transport(builder: EnvBuilder, request: FabricRequest, fabric: str) -> None:
    """Never silently on sockets: log NCCL's net choice to a file the trainer checks
    (on Ethernet, where sockets are the fabric, the check reports the choice and warns of nothing)."""
    builder.default(EXPECT_FABRIC_VAR, fabric, "the trainer checks NCCL's chosen network against this after the first collective")
    if request.require_fabric:
        builder.default(REQUIRE_FABRIC_VAR, "1", "--require-fabric: a fallback to sockets is an error")
    if "NCCL_DEBUG" not in request.env and request.nccl_debug is None:
        builder.default("NCCL_DEBUG", "INFO", "to see which network NCCL chose (written to NCCL_DEBUG_FILE, not the console)")
        builder.default("NCCL_DEBUG_SUBSYS", "INIT,NET", "only the init and network lines")
        builder.default("NCCL_DEBUG_FILE", nccl_debug_file(request), "one NCCL log per process; NCCL warnings land here too")


def _conditions(request: FabricRequest, facts: NodeFacts, profile: SiteProfile | None) -> dict[str, object]:
    """What a fabric default's "when" may ask (fabric/defaults.py: CONDITIONS, FACTS)."""
    return {
        "multi_node": request.multi_node,
        "roce": choose_roce_device(facts) is not None,
        "rdzv_get_disabled": rdzv_get_disabled(request.env),
        "kdreg2_default": facts.kdreg2_default,
        "gpu": profile.gpu if profile else None,
        "accelerator": profile.accelerator if profile else None,
        "machine": facts.machine,
    }


def plan_fabric(request: FabricRequest, facts: NodeFacts, data: FabricData) -> FabricPlan:
    profile = data.site_profile()
    fabric = fabric_named(profile.fabric if profile and profile.fabric != AUTO else detect_fabric(facts))
    builder = EnvBuilder(request.env)
    sockets_reason = ethernet_requested(request, profile)
    if (sockets_reason and fabric.NCCL_IB_TRANSPORT) or (request.gloo and fabric is not ethernet):
        builder.note("fabric", "info", f"{sockets_reason}: Ethernet sockets, although {fabric.NAME} devices are present")
        fabric = ethernet

    if request.nccl_debug is not None:
        level = request.nccl_debug.upper()
        if level not in NCCL_DEBUG_LEVELS:
            raise LaunchError(f"--nccl-debug {request.nccl_debug!r} is not a level; use one of {', '.join(NCCL_DEBUG_LEVELS)}")
        builder.force("NCCL_DEBUG", level, "--nccl-debug")

    # The site profile before the fabric defaults: the first to set a variable wins, and the
    # site's documentation decides where the public sources disagree.
    if profile:
        for item in profile.env:
            if item.name == "NCCL_SOCKET_IFNAME":
                continue  # used only as a fallback when the interfaces cannot be listed
            if item.value is None:
                builder.withhold(item.name, f"site {profile.name}: {item.source}")
                continue
            builder.default(item.name, item.value, f"site {profile.name}: {item.source}", SITE_PROFILE)
        builder.changes.extend(library_path_changes(profile, request.env, facts.existing_dirs, facts.loader_dirs))

    conditions = _conditions(request, facts, profile)
    defaults = data.fabric_defaults(fabric.NAME) if fabric.HAS_DEFAULTS else None
    fabric.plan(builder, FabricJob(request, facts, profile, defaults, conditions))

    for item in data.fabric_defaults(COMMON).applicable(conditions):
        builder.default(item.name, item.value, item.source)

    if request.multi_node:
        if not request.gloo:
            # On Ethernet too: sockets are expected there, and the log still says what NCCL
            # chose and why it failed when it does (the CPU workers' gloo logs nothing to NCCL).
            _observe_transport(builder, request, fabric.NAME)
        if request.require_fabric and not fabric.HIGH_SPEED and sockets_reason:
            raise LaunchError(f"--require-fabric contradicts {sockets_reason}: drop one of them")
        if request.require_fabric and not fabric.HIGH_SPEED:
            raise LaunchError(
                f"--require-fabric given but no high-speed fabric was found (no {_high_speed_devices()}); "
                "run on GPU nodes, pass --site, or drop --require-fabric"
            )
    return FabricPlan(fabric.NAME, tuple(builder.changes), tuple(builder.findings))
