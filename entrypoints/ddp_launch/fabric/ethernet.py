"""Plain Ethernet, every node's fallback: the interface whose route reaches the head node, for NCCL and Gloo.

Replaces per-node hand-written interface tables: the kernel's IPv4 routing table
(facts.routes, from /proc/net/route) already knows which interface reaches the head.
Never loopback in a multi-node job: rank 0 would advertise an address no other node reaches.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts, Resolved, Route
from ddp_launch.fabric.common import EnvBuilder, FabricJob, pod_socket_tuning

NAME = "ethernet"
TITLE = "Ethernet"
HIGH_SPEED = False      # NCCL's and Gloo's TCP sockets are its transport
HAS_DEFAULTS = False    # common.json only: every value it needs comes from the node's routes
DEVICES = ()
NCCL_IB_TRANSPORT = False
LIBFABRIC_PROVIDER = None
MISSING = MISSING_FIX = MISSING_FIX_IN_A_POD = ""  # never asked: the doctor looks only for an expected high-speed fabric
LOOPBACK_INTERFACE = "lo"


def detect(facts: NodeFacts) -> bool:
    """Every node: the fallback when no faster fabric is found."""
    return True


def route_interface(routes: tuple[Route, ...], address: str) -> str | None:
    """Longest-prefix match (then lowest metric) for an IPv4 address; loopback is lo."""
    ip = ipaddress.IPv4Address(address)
    if ip.is_loopback:
        return "lo"
    value = int(ip)
    best: Route | None = None
    for route in routes:
        if value & route.mask != route.destination & route.mask:
            continue
        if best is None or (route.mask, -route.metric) > (best.mask, -best.metric):
            best = route
    return best.interface if best else None


def routed_interfaces(routes: tuple[Route, ...]) -> tuple[str, ...]:
    """The interfaces other than loopback that carry a route, default route's first, in table order."""
    ordered = sorted((r for r in routes if r.interface != LOOPBACK_INTERFACE), key=lambda r: r.mask != 0)
    return tuple(dict.fromkeys(r.interface for r in ordered))


def loopback_problem(env: Mapping[str, str]) -> str | None:
    """The user's NCCL_/GLOO_SOCKET_IFNAME that names loopback, which no other node can reach."""
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if env.get(name, "").lstrip("=").split(",")[0] == LOOPBACK_INTERFACE:
            return (f"{name}={env[name]} is loopback on a multi-node job: rank 0 would advertise an address "
                    f"no other node reaches; unset it or name the interface of the nodes' network")
    return None


def _toward_the_other_nodes(facts: NodeFacts, head_address: str, address: str,
                            peer: Resolved | None) -> tuple[str, str] | None:
    """(interface, reason) on a head whose own name is loopback here, or None when it cannot be told.

    Debian puts a host's own name on 127.0.1.1 in /etc/hosts (Debian Reference, "The hostname
    resolution"), so the head cannot route to its own name; the other nodes reach it through the
    interface that routes to them. A dual-homed node (a default-route eno1 and a cluster network on
    ens1f1, each on its own subnet) is told by the route to another node of the job; a node with one
    interface needs no lookup.
    """
    loopback = f"head node {head_address} resolves to loopback {address} here (/etc/hosts)"
    if peer is not None and peer.address is not None:
        interface = route_interface(facts.routes, peer.address)
        if interface not in (None, LOOPBACK_INTERFACE):
            return interface, (f"{loopback}: the interface that routes to {peer.name} ({peer.address}, "
                               f"{peer.asked.source}), as the other nodes route to this one")
    interfaces = routed_interfaces(facts.routes)
    if len(interfaces) == 1:
        return interfaces[0], f"{loopback}: the only interface with a route, which reaches the other nodes"
    return None


def ethernet_defaults(builder: EnvBuilder, facts: NodeFacts, head_address: str | None,
                      address: str | None, peer: Resolved | None = None) -> None:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for a multi-node job: never loopback.

    head_address is the rendezvous host as torchrun gets it, address its IPv4 address when known;
    peer another node's lookup, made where the head's name is loopback on this node.
    """
    problem = loopback_problem(builder.env)
    if problem:
        builder.note("interface", "error", problem)
    if not head_address:
        return
    if address is None:
        builder.note("route", "warning",
                     f"cannot resolve head node {head_address} to IPv4; socket interface left to NCCL/Gloo")
        return
    interface = route_interface(facts.routes, address)
    reason = f"the interface that routes to the head node {head_address} ({address}), from /proc/net/route"
    if interface == LOOPBACK_INTERFACE:
        users = {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} <= set(builder.env)
        chosen = _toward_the_other_nodes(facts, head_address, address, peer)
        if chosen is None and users:
            return  # both interfaces are the user's
        if chosen is None and not facts.routes:
            builder.note("route", "warning",
                         f"head node {head_address} resolves to loopback {address} here and /proc/net/route lists "
                         f"no route; socket interface left to NCCL/Gloo")
            return
        if chosen is None:
            interfaces = routed_interfaces(facts.routes)
            have = f"interfaces {', '.join(interfaces)}" if interfaces else "no interface with a route"
            other = (f" and {peer.name} ({peer.asked.source}) did not resolve to a routed address"
                     if peer is not None else "")
            raise LaunchError(
                f"head node {head_address} resolves to loopback {address} here (/etc/hosts){other}, and this node "
                f"has {have}: cannot tell which one the other nodes reach; map the name to the node's address "
                f"on the cluster network in /etc/hosts, or set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to that "
                f"interface")
        interface, reason = chosen
    if interface is None:
        builder.note("route", "warning",
                     f"no route to head node {address} in /proc/net/route; socket interface left to NCCL/Gloo")
        return
    builder.default("NCCL_SOCKET_IFNAME", interface, reason)
    builder.default("GLOO_SOCKET_IFNAME", interface, reason)


def plan(builder: EnvBuilder, job: FabricJob) -> None:
    request = job.request
    if request.multi_node:
        ethernet_defaults(builder, job.facts, request.head_address, request.head_ipv4, request.peer)
        if not request.gloo:
            # Here NCCL's socket transport carries the data (no RDMA device, or NCCL_IB_DISABLE=1, as
            # runai/submit.sh sets for RUNAI_RDMA=0): its threads and sockets are what decide the speed.
            pod_socket_tuning(builder, request, "NCCL's data goes over TCP sockets here")
