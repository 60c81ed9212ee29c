"""Plain Ethernet: the interface whose route reaches the head node, for NCCL and Gloo.

Replaces per-node hand-written interface tables (seed 004): the kernel's IPv4
routing table (facts.routes, from /proc/net/route) already knows which interface reaches the head.
"""

from __future__ import annotations

import ipaddress

from ddp_launch.facts import NodeFacts, Route
from ddp_launch.fabric.common import EnvBuilder


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


def ethernet_defaults(builder: EnvBuilder, facts: NodeFacts, head_address: str | None) -> None:
    if not head_address:
        return
    address = facts.address_of(head_address)
    if address is None:
        builder.note("route", "warning",
                     f"cannot resolve head node {head_address} to IPv4; socket interface left to NCCL/Gloo")
        return
    interface = route_interface(facts.routes, address)
    if interface is None:
        builder.note("route", "warning",
                     f"no route to head node {address} in /proc/net/route; socket interface left to NCCL/Gloo")
        return
    reason = f"the interface that routes to the head node {head_address} ({address}), from /proc/net/route"
    builder.default("NCCL_SOCKET_IFNAME", interface, reason)
    builder.default("GLOO_SOCKET_IFNAME", interface, reason)
