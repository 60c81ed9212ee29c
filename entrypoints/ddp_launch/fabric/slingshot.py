"""HPE Slingshot (CXI) with NCCL's AWS OFI plugin: how a node shows it, and the rules that need the node or the job.

The values themselves are data (containers/sites/fabrics/slingshot.json); here are
NCCL_NET's conflict with a user's NCCL_NET_PLUGIN, the hsn* interface choice, and the notes for
the values a node's facts leave out (alt_read without --network=disable_rdzv_get, userfaultfd
where the host's libfabric defaults to kdreg2).
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts
from ddp_launch.fabric.common import EnvBuilder, FabricJob
from ddp_launch.fabric.defaults import (DISABLE_RDZV_GET, SRUN_NETWORK_VAR, FabricDefault, FabricDefaults,
                                        when_holds)
from ddp_launch.plan import SITE_PROFILE

NAME = "slingshot"
TITLE = "Slingshot"
HIGH_SPEED = True
HAS_DEFAULTS = True
DEVICES = ("/dev/cxi*", "/sys/class/cxi")
NCCL_IB_TRANSPORT = False   # NCCL reaches the CXI NICs through the OFI plugin and libfabric
LIBFABRIC_PROVIDER = "cxi"  # libfabric's CXI provider (fi_cxi(7))
MISSING = "no /dev/cxi* (found: {found})"
MISSING_FIX = MISSING_FIX_IN_A_POD = "run on a compute node; inside Apptainer /dev is shared, so check the node itself"


# Why FI_MR_CACHE_MONITOR stays unset on a node whose libfabric defaults to kdreg2 (how that is told:
# ddp_launch/mr_monitor.py).
KDREG2_KEPT = ("{name}={value} not set: the host's libfabric defaults to kdreg2 and /dev/kdreg2 is present, so "
               "the site's choice stands (HPE's Slingshot NCCL and RCCL tuning guides, HewlettPackard/shs-ccl-docs, "
               "list kdreg2 as \"another valid option\"; LUMI-AI-Guide PR #118 announces it as the coming default)")


def detect(facts: NodeFacts) -> bool:
    """CXI devices, or their sysfs class."""
    return facts.slingshot_present


def check_socket_ifname(value: str, interfaces: tuple[str, ...]) -> str | None:
    """A message when NCCL_SOCKET_IFNAME cannot match any interface (NCCL fails cryptically, nccl#1837)."""
    if value.startswith("^"):
        return None
    exact = value.startswith("=")
    wanted = [w for w in value.lstrip("=").split(",") if w]
    matched = [w for w in wanted if any((i == w) if exact else i.startswith(w) for i in interfaces)]
    if matched:
        return None
    return f"NCCL_SOCKET_IFNAME={value} matches no interface on this node (have: {', '.join(interfaces) or 'none'})"


def missing_plugin(builder: EnvBuilder, facts: NodeFacts, site: str | None) -> str | None:
    """Why NCCL could not load the net plugin that NCCL_NET requires, or None when it can (or was not looked for).

    NCCL dlopens libnccl-net.so (NCCL's ext-net/README.md; RCCL librccl-net.so), so the plugin must lie in the
    workers' LD_LIBRARY_PATH or in a directory the loader searches by itself (ld.so(8)).
    """
    found = facts.net_plugin
    if found is None or found.by_loader:
        return None
    planned = builder.planned("LD_LIBRARY_PATH")
    path = planned if planned is not None else builder.env.get("LD_LIBRARY_PATH", "")
    if set(found.in_dirs) & {d for d in path.split(":") if d}:
        return None
    return (f"NCCL_NET='AWS Libfabric' needs NCCL's OFI plugin ({found.file}), but it is neither on "
            f"LD_LIBRARY_PATH nor in the image's library directories, so NCCL would fail at the first "
            f"collective on every rank: bind the host's on the host, "
            f'export APPTAINER_BIND="$(python3 -m ddp_launch.binds --site {site or "SITE"})", then srun again')


def _nccl_net(builder: EnvBuilder, item: FabricDefault, conditions: Mapping[str, object],
              facts: NodeFacts, site: str | None) -> None:
    """NCCL_NET, unless the user's NCCL_NET_PLUGIN would make NCCL fail to find it (CSCS docs PR #75),
    and never when the plugin it requires cannot be loaded here."""
    env = builder.env
    if when_holds(item.when, conditions):
        if "NCCL_NET_PLUGIN" in env and "NCCL_NET" not in env:
            builder.note("plugin", "info",
                         "NCCL_NET not set because you set NCCL_NET_PLUGIN; with both NCCL cannot find "
                         "'AWS Libfabric' (CSCS docs PR #75). Unset NCCL_NET_PLUGIN to get the fail-fast check")
        elif "NCCL_NET" not in env and (problem := missing_plugin(builder, facts, site)):
            raise LaunchError(problem)
        else:
            builder.default(item.name, item.value, item.source)
    if "NCCL_NET_PLUGIN" in env and "NCCL_NET" in env:
        builder.note("plugin", "warning",
                     "NCCL_NET and NCCL_NET_PLUGIN are both set; NCCL then fails to find the network (unset NCCL_NET_PLUGIN)")


def _rdzv_get_note(builder: EnvBuilder, item: FabricDefault) -> None:
    """A value that needs srun --network=disable_rdzv_get, in a step without it: left out, or, where the
    user (or a module: Olivia's NCCL modules export HPE's ccl_env.sh) set it anyway, a warning."""
    flag = f"srun --network={DISABLE_RDZV_GET} ({SRUN_NETWORK_VAR} does not name it)"
    if builder.env.get(item.name) == item.value:
        builder.note("rendezvous", "warning",
                     f"{item.name}={item.value} is set, but this step has no {flag}, which it needs (libfabric's "
                     f"fi_cxi(7): the CXI driver's rdzv_get_en must be 0): add the flag to srun, or unset {item.name}")
    elif item.name not in builder.env:
        builder.note("rendezvous", "info",
                     f"{item.name}={item.value} not set: this step has no {flag}, which it needs; the job "
                     f"scripts give it from the site profile's srun_args")


def slingshot_defaults(
    builder: EnvBuilder,
    defaults: FabricDefaults,
    facts: NodeFacts,
    conditions: Mapping[str, object],
    profile_ifname: str | None,
    site: str | None = None,
) -> None:
    for item in defaults.env:
        if item.name == "NCCL_NET":
            _nccl_net(builder, item, conditions, facts, site)
        elif when_holds(item.when, conditions):
            builder.default(item.name, item.value, item.source)
        elif "rdzv_get_disabled" in (item.when or "").split():
            _rdzv_get_note(builder, item)
        elif "!kdreg2_default" in (item.when or "").split() and item.name not in builder.env:
            builder.note("monitor", "info", KDREG2_KEPT.format(name=item.name, value=item.value))
    env = builder.env
    interfaces = facts.hsn_interfaces
    if interfaces:
        builder.default(
            "NCCL_SOCKET_IFNAME", ",".join(interfaces),
            "the hsn* interfaces present in /sys/class/net (bootstrap on the Slingshot NICs, not the management network)",
        )
    elif interfaces is None and profile_ifname:
        builder.default("NCCL_SOCKET_IFNAME", profile_ifname, "site profile (could not list /sys/class/net)",
                        SITE_PROFILE)
    elif interfaces is not None:
        builder.note("interface", "warning", "Slingshot expected but no hsn* interface exists; NCCL_SOCKET_IFNAME left unset")
    if interfaces and "NCCL_SOCKET_IFNAME" in env:
        problem = check_socket_ifname(env["NCCL_SOCKET_IFNAME"], interfaces)
        if problem:
            # An error for doctor (NCCL will fail); the launcher keeps the user's value and says so.
            builder.note("interface", "error", problem)


def plan(builder: EnvBuilder, job: FabricJob) -> None:
    profile_ifname = job.profile.env_value("NCCL_SOCKET_IFNAME") if job.profile else None
    slingshot_defaults(builder, job.defaults, job.facts, job.conditions, profile_ifname.value if profile_ifname else None,
                       job.profile.name if job.profile else None)
