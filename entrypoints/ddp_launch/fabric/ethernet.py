"""Plain Ethernet: the interface whose route reaches the head node, for NCCL and Gloo.

Replaces per-node hand-written interface tables (seed 004): the kernel's IPv4
routing table (/proc/net/route) already knows which interface reaches the head.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from typing import Optional, Tuple

from ddp_launch.fabric.common import EnvBuilder, read_text

RTF_UP = 0x1


@dataclass(frozen=True)
class Route:
    interface: str
    destination: int
    mask: int
    metric: int


def _hex_le(value: str) -> int:
    """/proc/net/route prints addresses as host-order (little-endian) hex."""
    return struct.unpack("<I", struct.pack(">I", int(value, 16)))[0]


def parse_routes(text: str) -> Tuple[Route, ...]:
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            flags = int(fields[3], 16)
            if not flags & RTF_UP:
                continue
            routes.append(Route(fields[0], _hex_le(fields[1]), _hex_le(fields[7]), int(fields[6])))
        except ValueError:
            continue
    return tuple(routes)


def route_interface(routes: Tuple[Route, ...], address: str) -> Optional[str]:
    """Longest-prefix match (then lowest metric) for an IPv4 address; loopback is lo."""
    ip = ipaddress.IPv4Address(address)
    if ip.is_loopback:
        return "lo"
    value = int(ip)
    best: Optional[Route] = None
    for route in routes:
        if value & route.mask != route.destination & route.mask:
            continue
        if best is None or (route.mask, -route.metric) > (best.mask, -best.metric):
            best = route
    return best.interface if best else None


def resolve_ipv4(host: str) -> Optional[str]:
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError):  # UnicodeError: the IDNA codec refuses the name (a label over 63)
        return None
    return infos[0][4][0] if infos else None


def ethernet_defaults(builder: EnvBuilder, root: str, head_address: Optional[str]) -> None:
    if not head_address:
        return
    address = resolve_ipv4(head_address)
    if address is None:
        builder.notes.append(f"warning: cannot resolve head node {head_address} to IPv4; socket interface left to NCCL/Gloo")
        return
    table = read_text(root, "/proc/net/route")
    interface = route_interface(parse_routes(table or ""), address)
    if interface is None:
        builder.notes.append(f"warning: no route to head node {address} in /proc/net/route; socket interface left to NCCL/Gloo")
        return
    reason = f"the interface that routes to the head node {head_address} ({address}), from /proc/net/route"
    builder.default("NCCL_SOCKET_IFNAME", interface, reason)
    builder.default("GLOO_SOCKET_IFNAME", interface, reason)
