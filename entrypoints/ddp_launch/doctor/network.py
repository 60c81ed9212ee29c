"""The network checks: the interface NCCL would advertise (NCCL_SOCKET_IFNAME, the user's or the
plan's) and a TCP connect to the launch plan's rendezvous endpoint."""

from __future__ import annotations

from ddp_launch.doctor.context import DoctorContext, planned
from ddp_launch.doctor.report import FAIL, OK, SKIP, WARN, Check
from ddp_launch.fabric.slingshot import check_socket_ifname
from ddp_launch.rendezvous import host_name_problem


def check_interface(ctx: DoctorContext) -> Check:
    value = planned(ctx, "NCCL_SOCKET_IFNAME")
    interfaces = ctx.facts.net_interfaces
    for finding in ctx.fabric.findings:
        if finding.topic in ("interface", "route") and finding.severity in ("warning", "error"):
            status = FAIL if finding.severity == "error" else WARN
            return Check("interface", status, finding.text, "unset NCCL_SOCKET_IFNAME or name an interface from `ip -br link`")
    if not value:
        return Check("interface", OK, "NCCL_SOCKET_IFNAME unset; NCCL picks the interface")
    if value.lstrip("=").split(",")[0] == "lo":
        # Rank 0 advertises this interface's address to the other nodes: loopback reaches none.
        return Check("interface", FAIL if ctx.multi_node else WARN,
                     f"NCCL_SOCKET_IFNAME={value} is loopback: no other node can reach this one through it",
                     "unset NCCL_SOCKET_IFNAME or name the interface of the nodes' network (`ip -br addr`)")
    if interfaces is None:
        return Check("interface", SKIP, f"NCCL_SOCKET_IFNAME={value}; /sys/class/net cannot be listed")
    problem = check_socket_ifname(value, interfaces)
    if problem:
        return Check("interface", FAIL, problem, "unset NCCL_SOCKET_IFNAME or name an interface from `ip -br link`")
    return Check("interface", OK, f"NCCL_SOCKET_IFNAME={value}")


def check_head_node(ctx: DoctorContext) -> Check:
    """The launch plan's rendezvous endpoint, at the address the launcher's probe found for it."""
    if ctx.offline:
        return Check("head node", SKIP, "--offline")
    endpoint = ctx.launch.rendezvous if ctx.launch is not None else None
    if endpoint is None or endpoint.port is None:
        why = "the launch plan has none" if ctx.launch is not None else "no launch plan (see the launch plan check)"
        return Check("head node", SKIP, f"no rendezvous endpoint to try: {why}")
    host, port = endpoint.host, endpoint.port
    problem = host_name_problem(host)
    if problem is not None:
        return Check("head node", FAIL, f"{host!r} is not a valid host name ({problem})",
                     "set --rdzv-host / DDP_LAUNCH_RDZV_HOST to the head node's name or IPv4 address")
    address = ctx.facts.address_of(host)
    if address is None:
        return Check("head node", FAIL, f"{host} does not resolve to an IPv4 address here",
                     "use the head node's IP (--rdzv-host) or fix DNS")
    if ctx.facts.head is not None and ctx.facts.head.address == address and ctx.facts.head.name != address:
        host = ctx.facts.head.name  # the plan carries the address; say which node it is
    outcome = ctx.probes.connect(address, port, 3.0)
    if outcome == "open":
        return Check("head node", OK, f"{host} ({address}) port {port} accepts connections")
    if outcome == "refused":
        return Check("head node", OK, f"{host} ({address}) reachable; port {port} not listening yet (normal before the launch)")
    return Check("head node", FAIL, f"{host} ({address}) port {port}: {outcome}",
                 "a firewall or the wrong interface blocks the rendezvous; pick another --rdzv-port or --rdzv-host")
