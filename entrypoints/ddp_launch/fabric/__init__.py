"""Fabric environment for NCCL/libfabric: Slingshot (CXI), InfiniBand/RoCE, Ethernet.

plan_fabric(request, facts, data) is pure: the node was read once into NodeFacts (facts.py),
the files once into FabricData (defaults.py, read at the edge: cli, doctor), and the values
come from that data with their sources. Each variable is layered as:

    fabric default  <  site profile  <  the user's environment

each overriding the one before. Fabric defaults are containers/sites/fabrics/<fabric>.json
(then common.json, for every fabric); site profiles are containers/sites/<site>.json; a
variable already in the environment is never changed (a "kept" finding says so), except
by an explicit flag (--nccl-debug). Every change carries its reason for --dry-run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ddp_contract import EXPECT_FABRIC_VAR, LOG_DIR_VAR, REQUIRE_FABRIC_VAR
from ddp_contract.scheduler_names import JOB_NAME_VARIABLES
from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts, Resolved
from ddp_launch.fabric.common import EnvBuilder
from ddp_launch.fabric.defaults import FabricData, rdzv_get_disabled
from ddp_launch.fabric.ethernet import ethernet_defaults
from ddp_launch.fabric.infiniband import choose_roce_device, infiniband_defaults
from ddp_launch.fabric.libpaths import library_path_changes, search_directories
from ddp_launch.fabric.slingshot import slingshot_defaults
from ddp_launch.plan import SITE_PROFILE, EnvChange, Finding
from ddp_launch.sites import SiteProfile

NCCL_DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "TRACE")
HIGH_SPEED_FABRICS = ("slingshot", "infiniband")
# --dry-run prints warnings and errors alike as "warning:": the launcher still runs with
# the user's value; doctor reads the severity and FAILs an error.
_NOTE_PREFIX = {"info": "", "warning": "warning: ", "error": "warning: "}


@dataclass(frozen=True)
class FabricRequest:
    env: Mapping[str, str]              # the environment the launcher was started with
    multi_node: bool                    # more than one node in this job step
    head_address: str | None = None     # rendezvous host, for route-based interface choice
    head_ipv4: str | None = None        # its IPv4 address, when known (the route is to this)
    peer: Resolved | None = None        # another node's lookup, where the head's name is loopback here
    nccl_debug: str | None = None       # --nccl-debug LEVEL
    require_fabric: bool = False        # --require-fabric
    gloo: bool = False                  # CPU workers: gloo over TCP, whatever the node's HCAs
    log_dir: str | None = None          # --log-dir: NCCL's log goes beside torchrun's


@dataclass(frozen=True)
class FabricPlan:
    fabric: str                         # slingshot | infiniband | ethernet
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
    """Slingshot if CXI devices exist, else InfiniBand/RoCE if RDMA devices exist, else Ethernet."""
    if facts.slingshot_present:
        return "slingshot"
    if facts.rdma_devices:
        return "infiniband"
    return "ethernet"


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
    if profile is not None and profile.fabric == "ethernet":
        return f"site {profile.name} says ethernet"
    return None


def nccl_debug_file(request: FabricRequest) -> str:
    """One NCCL log per process (%h host, %p pid), where the transport check looks."""
    env = request.env
    # DDP_LAUNCH_LOG_DIR, when exported, has always named this place, even beside --log-dir.
    directory = env[LOG_DIR_VAR] if LOG_DIR_VAR in env else request.log_dir
    directory = directory or env.get("TMPDIR") or "/tmp"
    job = next((env[name] for name in JOB_NAME_VARIABLES if env.get(name)), "local")
    return os.path.join(directory, f"nccl-{job}.%h.%p.log")


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


def plan_fabric(request: FabricRequest, facts: NodeFacts, data: FabricData) -> FabricPlan:
    profile = data.site_profile()
    fabric = profile.fabric if profile and profile.fabric != "auto" else detect_fabric(facts)
    builder = EnvBuilder(request.env)
    sockets_reason = ethernet_requested(request, profile)
    if (sockets_reason and fabric == "infiniband") or (request.gloo and fabric != "ethernet"):
        builder.note("fabric", "info", f"{sockets_reason}: Ethernet sockets, although {fabric} devices are present")
        fabric = "ethernet"

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
            builder.default(item.name, item.value, f"site {profile.name}: {item.source}", SITE_PROFILE)
        builder.changes.extend(library_path_changes(profile, request.env, facts.existing_dirs, facts.loader_dirs))

    conditions = {  # what a fabric default's "when" may ask (fabric/defaults.py: CONDITIONS, FACTS)
        "multi_node": request.multi_node,
        "roce": choose_roce_device(facts.rdma_devices) is not None,
        "rdzv_get_disabled": rdzv_get_disabled(request.env),
        "gpu": profile.gpu if profile else None,
        "accelerator": profile.accelerator if profile else None,
        "machine": facts.machine,
    }
    if fabric == "slingshot":
        profile_ifname = profile.env_value("NCCL_SOCKET_IFNAME") if profile else None
        slingshot_defaults(builder, data.fabric_defaults("slingshot"), facts, conditions,
                           profile_ifname.value if profile_ifname else None, profile.name if profile else None)
    elif fabric == "infiniband":
        infiniband_defaults(builder, data.fabric_defaults("infiniband"), facts, conditions, request.env)
    elif request.multi_node:
        ethernet_defaults(builder, facts, request.head_address, request.head_ipv4, request.peer)

    for item in data.fabric_defaults("common").applicable(conditions):
        builder.default(item.name, item.value, item.source)

    if request.multi_node:
        if not request.gloo:
            # On Ethernet too: sockets are expected there, and the log still says what NCCL
            # chose and why it failed when it does (the CPU workers' gloo logs nothing to NCCL).
            _observe_transport(builder, request, fabric)
        if request.require_fabric and fabric not in HIGH_SPEED_FABRICS and sockets_reason:
            raise LaunchError(f"--require-fabric contradicts {sockets_reason}: drop one of them")
        if request.require_fabric and fabric not in HIGH_SPEED_FABRICS:
            raise LaunchError(
                "--require-fabric given but no high-speed fabric was found (no /dev/cxi*, /sys/class/cxi "
                "or /sys/class/infiniband); run on GPU nodes, pass --site, or drop --require-fabric"
            )
    return FabricPlan(fabric, tuple(builder.changes), tuple(builder.findings))
