"""HPE Slingshot (CXI) with NCCL's AWS OFI plugin: the rules that need the node or the job.

The values themselves are data (containers/sites/fabrics/slingshot.json); here are
NCCL_NET's conflict with a user's NCCL_NET_PLUGIN and the hsn* interface choice.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp_launch.facts import NodeFacts
from ddp_launch.fabric.common import EnvBuilder
from ddp_launch.fabric.defaults import FabricDefault, FabricDefaults


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


def _nccl_net(builder: EnvBuilder, item: FabricDefault, conditions: Mapping[str, bool]) -> None:
    """NCCL_NET, unless the user's NCCL_NET_PLUGIN would make NCCL fail to find it (CSCS docs PR #75)."""
    env = builder.env
    if item.when is None or conditions[item.when]:
        if "NCCL_NET_PLUGIN" in env and "NCCL_NET" not in env:
            builder.note("plugin", "info",
                         "NCCL_NET not set because you set NCCL_NET_PLUGIN; with both NCCL cannot find "
                         "'AWS Libfabric' (CSCS docs PR #75). Unset NCCL_NET_PLUGIN to get the fail-fast check")
        else:
            builder.default(item.name, item.value, item.source)
    if "NCCL_NET_PLUGIN" in env and "NCCL_NET" in env:
        builder.note("plugin", "warning",
                     "NCCL_NET and NCCL_NET_PLUGIN are both set; NCCL then fails to find the network (unset NCCL_NET_PLUGIN)")


def slingshot_defaults(
    builder: EnvBuilder,
    defaults: FabricDefaults,
    facts: NodeFacts,
    conditions: Mapping[str, bool],
    profile_ifname: str | None,
) -> None:
    for item in defaults.env:
        if item.name == "NCCL_NET":
            _nccl_net(builder, item, conditions)
        elif item.when is None or conditions[item.when]:
            builder.default(item.name, item.value, item.source)
    env = builder.env
    interfaces = facts.hsn_interfaces
    if interfaces:
        builder.default(
            "NCCL_SOCKET_IFNAME", ",".join(interfaces),
            "the hsn* interfaces present in /sys/class/net (bootstrap on the Slingshot NICs, not the management network)",
        )
    elif interfaces is None and profile_ifname:
        builder.default("NCCL_SOCKET_IFNAME", profile_ifname, "site profile (could not list /sys/class/net)")
    elif interfaces is not None:
        builder.note("interface", "warning", "Slingshot expected but no hsn* interface exists; NCCL_SOCKET_IFNAME left unset")
    if interfaces and "NCCL_SOCKET_IFNAME" in env:
        problem = check_socket_ifname(env["NCCL_SOCKET_IFNAME"], interfaces)
        if problem:
            # An error for doctor (NCCL will fail); the launcher keeps the user's value and says so.
            builder.note("interface", "error", problem)
