"""Plain Ethernet: the interface whose route reaches the head node, for NCCL and Gloo.

Replaces per-node hand-written interface tables: the kernel's IPv4 routing table
(facts.routes, from /proc/net/route) already knows which interface reaches the head.
Never loopback in a multi-node job: rank 0 would advertise an address no other node reaches.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts, Route
from ddp_launch.fabric.common import EnvBuilder

LOOPBACK_INTERFACE = "lo"


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


def outward_interface(routes: tuple[Route, ...]) -> str | None:
    """The interface that reaches other hosts: the default route's (lowest metric), else the
    only interface other than loopback with a route, else None."""
    outward = [r for r in routes if r.interface != LOOPBACK_INTERFACE]
    defaults = [r for r in outward if r.mask == 0]
    if defaults:
        return min(defaults, key=lambda r: r.metric).interface
    names = {r.interface for r in outward}
    return names.pop() if len(names) == 1 else None


def loopback_problem(env: Mapping[str, str]) -> str | None:
    """The user's NCCL_/GLOO_SOCKET_IFNAME that names loopback, which no other node can reach."""
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        if env.get(name, "").lstrip("=").split(",")[0] == LOOPBACK_INTERFACE:
            return (f"{name}={env[name]} is loopback on a multi-node job: rank 0 would advertise an address "
                    f"no other node reaches; unset it or name the interface of the nodes' network")
    return None


def ethernet_defaults(builder: EnvBuilder, facts: NodeFacts, head_address: str | None,
                      address: str | None) -> None:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME for a multi-node job: never loopback.

    head_address is the rendezvous host as torchrun gets it, address its IPv4 address when known.
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
        # Only a loopback answer for the head's own name (Debian's 127.0.1.1 line in /etc/hosts,
        # Debian Reference "The hostname resolution"): the other nodes come by the default route.
        interface = outward_interface(facts.routes)
        users = {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} <= set(builder.env)
        if interface is None and not facts.routes and not users:
            builder.note("route", "warning",
                         f"head node {head_address} resolves to loopback {address} here and /proc/net/route lists "
                         f"no route; socket interface left to NCCL/Gloo")
            return
        if interface is None and not users:
            raise LaunchError(
                f"head node {head_address} resolves to loopback {address} here and no other interface has "
                f"a default route, so the other nodes could not reach it: map the name to the node's network "
                f"address in /etc/hosts, or set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to that interface")
        reason = (f"head node {head_address} resolves to loopback {address} here (/etc/hosts): "
                  f"the interface of the default route, which reaches the other nodes")
    if interface is None:
        if route_interface(facts.routes, address) == LOOPBACK_INTERFACE:
            return  # both interfaces are the user's
        builder.note("route", "warning",
                     f"no route to head node {address} in /proc/net/route; socket interface left to NCCL/Gloo")
        return
    builder.default("NCCL_SOCKET_IFNAME", interface, reason)
    builder.default("GLOO_SOCKET_IFNAME", interface, reason)
