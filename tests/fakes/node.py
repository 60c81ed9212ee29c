"""Fake /sys, /dev and /proc trees laid out like real nodes, for the fabric and doctor tests."""

from __future__ import annotations

from pathlib import Path

# /proc/net/route of a node with eth0 (10.0.0.0/24, default route) and ens1f1 (192.168.10.0/24).
PROC_NET_ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
    "eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
    "eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
    "ens1f1\t000AA8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
)


class FakeNode:
    """Builds a node's pseudo-files under a tmp root, with the kernel's real paths."""

    def __init__(self, root: Path):
        self.root = root

    def file(self, path: str, text: str = "") -> Path:
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        return target

    def directory(self, path: str) -> Path:
        target = self.root / path.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        return target

    def cxi(self, count: int = 4) -> None:
        for index in range(count):
            self.file(f"/dev/cxi{index}")
            self.directory(f"/sys/class/cxi/cxi{index}")
            self.directory(f"/sys/class/net/hsn{index}")
        self.directory("/sys/class/net/nmn0")
        self.directory("/sys/class/net/lo")

    def net(self, *names: str) -> None:
        for name in names:
            self.directory(f"/sys/class/net/{name}")

    def rdma(self, device: str, gids: dict, link_layer: str = "Ethernet") -> None:
        """gids: index -> (gid text, type text or None for an unreadable entry[, its interface's name,
        gid_attrs/ndevs, which a kernel without that file does not give])."""
        base = f"/sys/class/infiniband/{device}/ports/1"
        self.file(f"{base}/link_layer", link_layer + "\n")
        for index, (gid, kind, *interface) in gids.items():
            self.file(f"{base}/gids/{index}", gid + "\n")
            if kind is not None:
                self.file(f"{base}/gid_attrs/types/{index}", kind + "\n")
            if interface:
                self.file(f"{base}/gid_attrs/ndevs/{index}", interface[0] + "\n")

    def route(self, text: str = PROC_NET_ROUTE) -> None:
        self.file("/proc/net/route", text)


# Real RoCE port layout (mlx5_bond_0 on RCP): link-local IPv6 v1/v2, IPv4-mapped v1/v2, global IPv6.
RCP_GIDS = {
    0: ("fe80:0000:0000:0000:5054:00ff:fe12:3456", "IB/RoCE v1"),
    1: ("fe80:0000:0000:0000:5054:00ff:fe12:3456", "RoCE v2"),
    2: ("0000:0000:0000:0000:0000:ffff:ac12:8003", "IB/RoCE v1"),
    3: ("0000:0000:0000:0000:0000:ffff:ac12:8003", "RoCE v2"),
    4: ("0000:0000:0000:0000:0000:0000:0000:0000", None),
}

# Two pods on one node sharing mlx5_bond_0 (an rdma/rdma resource is a shared device): each pod's Multus
# interface is named net1 in its own namespace, and a table that shows both pods' entries names net1 for
# both (gid_attrs/ndevs). The first pod's net1 is 172.18.128.3 (RCP_GIDS' entries), the second's .4.
RCP_TWO_PODS_GIDS = {
    **{index: (gid, kind, "net1") for index, (gid, kind) in RCP_GIDS.items() if kind is not None},
    5: ("fe80:0000:0000:0000:5054:00ff:fe12:3457", "IB/RoCE v1", "net1"),
    6: ("fe80:0000:0000:0000:5054:00ff:fe12:3457", "RoCE v2", "net1"),
    7: ("0000:0000:0000:0000:0000:ffff:ac12:8004", "IB/RoCE v1", "net1"),
    8: ("0000:0000:0000:0000:0000:ffff:ac12:8004", "RoCE v2", "net1"),
}


def node_facts(node: FakeNode, site=None, env=None, machine: str = "aarch64", head=None, address=None):
    """NodeFacts probed from the fake tree, as the planner would ask: the site's library
    directories, and head looked up by a fake resolver that answers address."""
    from dataclasses import replace

    from ddp_launch import facts
    from ddp_launch.fabric import directories_to_probe
    from ddp_launch.fabric.defaults import read_fabric_data
    from ddp_launch.rendezvous import Head

    resolve = (lambda name: address) if head is not None else None
    asked = Head.named(head, "the test's head") if head is not None else None
    data = read_fabric_data(site, env or {})
    probed = facts.probe(str(node.root), directories_to_probe(data), asked, resolve, accelerator=data.accelerator)
    return replace(probed, machine=machine)


def fabric_plan(node: FakeNode, machine: str = "aarch64", head_lookup=None, site=None, **request):
    """plan_fabric for a FabricRequest(**request) on the fake node, with the data files for site
    (read as cli reads them); head_lookup: (name, address).

    The head's IPv4 address is the lookup's answer, or head_address itself when it is one,
    as the planner hands it on from the scheduler's rendezvous endpoint."""
    from ddp_launch.fabric import FabricRequest, plan_fabric
    from ddp_launch.fabric.defaults import read_fabric_data
    from ddp_launch.rendezvous import ipv4_literal

    head, address = head_lookup if head_lookup else (None, None)
    head_address = request.get("head_address")
    if "head_ipv4" not in request and head_address is not None:
        request["head_ipv4"] = ipv4_literal(head_address) or (address if head == head_address else None)
    fabric_request = FabricRequest(**{"env": {}, "multi_node": True, **request})
    return plan_fabric(fabric_request, node_facts(node, site, fabric_request.env, machine, head, address),
                       read_fabric_data(site, fabric_request.env))
