"""Fabric environment for NCCL/libfabric: Slingshot (CXI), InfiniBand/RoCE, Ethernet.

Contract with the launcher: cli builds a FabricRequest from plain data and
adds fabric_env_changes(request) to the launch plan. Values are set only where
the user has not set them; each change carries its reason (source) for --dry-run.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from ddp_launch.errors import LaunchError
from ddp_launch.fabric.common import EnvBuilder
from ddp_launch.fabric.ethernet import ethernet_defaults
from ddp_launch.fabric.infiniband import infiniband_defaults, rdma_device_names
from ddp_launch.fabric.libpaths import library_path_changes
from ddp_launch.fabric.slingshot import slingshot_defaults, slingshot_present
from ddp_launch.plan import EnvChange
from ddp_launch.sites import SiteProfile, load_site

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
EXPECT_FABRIC_VAR = "DDP_EXPECT_FABRIC"
REQUIRE_FABRIC_VAR = "DDP_REQUIRE_FABRIC"
LOG_DIR_VAR = "DDP_LAUNCH_LOG_DIR"
HIGH_SPEED_FABRICS = ("slingshot", "infiniband")


@dataclass(frozen=True)
class FabricRequest:
    env: Mapping[str, str]          # the environment the launcher was started with
    multi_node: bool                # more than one node in this job step
    site: Optional[str] = None      # --site / DDP_LAUNCH_SITE, e.g. "olivia"; None = detect
    head_address: Optional[str] = None  # rendezvous host, for route-based interface choice
    root: str = "/"                 # filesystem root for /sys and /dev probes (tests use fake trees)
    nccl_debug: Optional[str] = None    # --nccl-debug LEVEL
    require_fabric: bool = False    # --require-fabric
    machine: Optional[str] = None   # CPU architecture; None = platform.machine()
    gloo: bool = False              # CPU workers: gloo over TCP, whatever the node's HCAs


@dataclass(frozen=True)
class FabricPlan:
    fabric: str                     # slingshot | infiniband | ethernet
    changes: Tuple[EnvChange, ...]
    notes: Tuple[str, ...]          # kept user values and warnings, for --dry-run and doctor


def detect_fabric(root: str) -> str:
    """Slingshot if CXI devices exist, else InfiniBand/RoCE if RDMA devices exist, else Ethernet."""
    if slingshot_present(root):
        return "slingshot"
    if rdma_device_names(root):
        return "infiniband"
    return "ethernet"


def ethernet_requested(request: FabricRequest, profile: Optional[SiteProfile]) -> Optional[str]:
    """Why this job must use Ethernet sockets though the node has a faster fabric, if it must.

    Nodes often carry an InfiniBand HCA that the job may not use (seed 004, "InfiniBand
    conflicts": NCCL_IB_DISABLE=1 forces Ethernet). Then NCCL needs its socket interface
    chosen per node, and sockets are what the transport check must expect.
    """
    if request.gloo:
        return "CPU workers (gloo over TCP)"
    if request.env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return "NCCL_IB_DISABLE=1"
    if profile is not None and profile.fabric == "ethernet":
        return f"site {profile.name} says ethernet"
    return None


def nccl_debug_file(env: Mapping[str, str]) -> str:
    """One NCCL log per process (%h host, %p pid), where transport.check_nccl_transport looks."""
    directory = env.get(LOG_DIR_VAR) or env.get("TMPDIR") or "/tmp"
    job = env.get("SLURM_JOB_ID") or env.get("RUNAI_JOB_NAME") or "local"
    return os.path.join(directory, f"nccl-{job}.%h.%p.log")


def _observe_transport(builder: EnvBuilder, request: FabricRequest, fabric: str) -> None:
    """Never silently on sockets: log NCCL's net choice to a file the trainer checks."""
    builder.default(EXPECT_FABRIC_VAR, fabric, "the trainer checks NCCL's chosen network against this after the first collective")
    if request.require_fabric:
        builder.default(REQUIRE_FABRIC_VAR, "1", "--require-fabric: a fallback to sockets is an error")
    if "NCCL_DEBUG" not in request.env and request.nccl_debug is None:
        builder.default("NCCL_DEBUG", "INFO", "to see which network NCCL chose (written to NCCL_DEBUG_FILE, not the console)")
        builder.default("NCCL_DEBUG_SUBSYS", "INIT,NET", "only the init and network lines")
        builder.default("NCCL_DEBUG_FILE", nccl_debug_file(request.env), "one NCCL log per process; NCCL warnings land here too")


def plan_fabric(request: FabricRequest) -> FabricPlan:
    profile: Optional[SiteProfile] = load_site(request.site, request.env) if request.site else None
    fabric = profile.fabric if profile and profile.fabric != "auto" else detect_fabric(request.root)
    machine = request.machine or platform.machine()
    builder = EnvBuilder(request.env)
    sockets_reason = ethernet_requested(request, profile)
    if (sockets_reason and fabric == "infiniband") or (request.gloo and fabric != "ethernet"):
        builder.notes.append(f"{sockets_reason}: Ethernet sockets, although {fabric} devices are present")
        fabric = "ethernet"

    if request.nccl_debug is not None:
        level = request.nccl_debug.upper()
        if level not in NCCL_DEBUG_LEVELS:
            raise LaunchError(f"--nccl-debug {request.nccl_debug!r} is not a level; use one of {', '.join(NCCL_DEBUG_LEVELS)}")
        builder.force("NCCL_DEBUG", level, "--nccl-debug")

    # Site documentation first: it decides where the public sources disagree.
    if profile:
        for item in profile.env:
            if item.name == "NCCL_SOCKET_IFNAME":
                continue  # used only as a fallback when the interfaces cannot be listed
            builder.default(item.name, item.value, f"site {profile.name}: {item.source}")
        builder.changes.extend(library_path_changes(profile, request.env, request.root))

    if fabric == "slingshot":
        profile_ifname = profile.env_value("NCCL_SOCKET_IFNAME") if profile else None
        gh200 = bool(profile and profile.gpu == "gh200" and machine == "aarch64")
        slingshot_defaults(builder, request.root, request.multi_node, gh200, profile_ifname.value if profile_ifname else None)
    elif fabric == "infiniband":
        infiniband_defaults(builder, request.root, request.env)
    elif request.multi_node:
        ethernet_defaults(builder, request.root, request.head_address)

    builder.default("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "CSCS: tear down on NCCL errors instead of hanging")

    if request.multi_node:
        if fabric in HIGH_SPEED_FABRICS:
            _observe_transport(builder, request, fabric)
        elif request.require_fabric and sockets_reason:
            raise LaunchError(f"--require-fabric contradicts {sockets_reason}: drop one of them")
        elif request.require_fabric:
            raise LaunchError(
                "--require-fabric given but no high-speed fabric was found (no /dev/cxi*, /sys/class/cxi "
                "or /sys/class/infiniband); run on GPU nodes, pass --site, or drop --require-fabric"
            )
    return FabricPlan(fabric, tuple(builder.changes), tuple(builder.notes))


def fabric_env_changes(request: FabricRequest) -> Tuple[EnvChange, ...]:
    """The environment changes for this node's fabric (see plan_fabric for notes too)."""
    return plan_fabric(request).changes
