"""Ethernet: the interface whose route reaches the head node (/proc/net/route), for NCCL and Gloo."""

from __future__ import annotations

import pytest
from fakes.node import PROC_NET_ROUTE, fabric_plan

from ddp_launch.errors import LaunchError
from ddp_launch.fabric.ethernet import route_interface
from ddp_launch.facts import Resolved, parse_routes
from ddp_launch.rendezvous import Head

ROUTES = parse_routes(PROC_NET_ROUTE)


@pytest.mark.parametrize(
    "address, interface",
    [
        ("10.0.0.17", "eth0"),        # on eth0's subnet
        ("192.168.10.5", "ens1f1"),   # the more specific route wins over the default
        ("8.8.8.8", "eth0"),          # only the default route matches
        ("127.0.0.1", "lo"),
    ],
)
def test_route_interface_longest_prefix(address, interface):
    assert route_interface(ROUTES, address) == interface


def test_routes_that_are_down_are_ignored():
    table = PROC_NET_ROUTE.replace("ens1f1\t000AA8C0\t00000000\t0001", "ens1f1\t000AA8C0\t00000000\t0000")
    assert route_interface(parse_routes(table), "192.168.10.5") == "eth0"


def test_no_route_gives_none():
    header_only = PROC_NET_ROUTE.splitlines()[0] + "\n"
    assert route_interface(parse_routes(header_only), "10.1.2.3") is None


def test_multi_node_sets_nccl_and_gloo_interfaces(node):
    node.route()
    changes = fabric_plan(node, head_address="192.168.10.1").changes
    env = {c.name: c.value for c in changes}
    assert env["NCCL_SOCKET_IFNAME"] == "ens1f1"
    assert env["GLOO_SOCKET_IFNAME"] == "ens1f1"
    assert "NCCL_IB_DISABLE" not in env


def test_user_interface_is_kept(node):
    node.route()
    changes = fabric_plan(node, env={"NCCL_SOCKET_IFNAME": "eth0"}, head_address="192.168.10.1").changes
    names = [c.name for c in changes]
    assert "NCCL_SOCKET_IFNAME" not in names and "GLOO_SOCKET_IFNAME" in names


def test_unresolvable_head_is_a_note_not_a_crash(node):
    node.route()
    plan = fabric_plan(node, head_address="no-such-host.invalid", head_lookup=("no-such-host.invalid", None))
    assert "NCCL_SOCKET_IFNAME" not in [c.name for c in plan.changes]
    assert any("cannot resolve" in n for n in plan.notes)


def test_the_head_name_is_routed_by_the_probes_answer(node):
    node.route()
    plan = fabric_plan(node, head_address="head-1", head_lookup=("head-1", "192.168.10.7"))
    values = {c.name: c for c in plan.changes}
    assert values["NCCL_SOCKET_IFNAME"].value == "ens1f1"
    assert "head node head-1 (192.168.10.7)" in values["NCCL_SOCKET_IFNAME"].reason


def test_no_route_to_the_head_is_a_route_warning(node):
    node.route(PROC_NET_ROUTE.splitlines()[0] + "\n")
    plan = fabric_plan(node, head_address="10.1.2.3")
    assert [(f.topic, f.severity) for f in plan.findings] == [("route", "warning")]
    assert plan.notes == ("warning: no route to head node 10.1.2.3 in /proc/net/route; "
                          "socket interface left to NCCL/Gloo",)


def test_ib_disable_only_when_the_site_asks(node, tmp_path):
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "lab.json").write_text(
        '{"schema": 1, "name": "lab", "fabric": "ethernet", "binds": [],'
        ' "env": {"NCCL_IB_DISABLE": {"value": "1", "source": "lab wiki: no RDMA here"}}}'
    )
    node.route()
    changes = fabric_plan(node, env={"DDP_SITES_DIR": str(sites)}, site="lab", head_address="10.0.0.2").changes
    reasons = {c.name: c.reason for c in changes}
    assert "lab wiki" in reasons["NCCL_IB_DISABLE"]


# Ethernet nodes that also carry an InfiniBand HCA, which the job turns off with NCCL_IB_DISABLE=1
# (NCCL then falls back to IP sockets:
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-disable).
IB_NODE_GIDS = {0: ("fe80:0000:0000:0000:0202:c9ff:fe00:0001", "IB/RoCE v1")}


@pytest.mark.parametrize("env, kwargs, reason", [
    ({"NCCL_IB_DISABLE": "1"}, {}, "NCCL_IB_DISABLE=1"),
    ({}, {"gloo": True}, "CPU workers (gloo over TCP)"),
])
def test_ethernet_asked_for_on_a_node_with_an_hca_picks_the_interface_and_expects_sockets(
        node, env, kwargs, reason):
    node.route()
    node.rdma("mlx5_0", IB_NODE_GIDS, link_layer="InfiniBand")

    plan = fabric_plan(node, env=env, head_address="192.168.10.1", **kwargs)

    values = {c.name: c.value for c in plan.changes}
    assert plan.fabric == "ethernet"
    assert values["NCCL_SOCKET_IFNAME"] == "ens1f1" and values["GLOO_SOCKET_IFNAME"] == "ens1f1"
    # The trainer must not call sockets a fallback: ethernet expected (NCCL), or nothing (gloo).
    assert values.get("DDP_EXPECT_FABRIC", "ethernet") == "ethernet"
    assert any(note.startswith(reason) for note in plan.notes)


def test_the_hca_is_used_when_nothing_asks_for_ethernet(node):
    node.route()
    node.rdma("mlx5_0", IB_NODE_GIDS, link_layer="InfiniBand")

    plan = fabric_plan(node, head_address="192.168.10.1")

    assert plan.fabric == "infiniband"
    assert {c.name: c.value for c in plan.changes}["DDP_EXPECT_FABRIC"] == "infiniband"


def test_require_fabric_with_ib_disabled_is_a_contradiction(node):
    node.route()
    node.rdma("mlx5_0", IB_NODE_GIDS, link_layer="InfiniBand")

    with pytest.raises(LaunchError, match="--require-fabric contradicts NCCL_IB_DISABLE=1"):
        fabric_plan(node, env={"NCCL_IB_DISABLE": "1"}, head_address="192.168.10.1", require_fabric=True)


# --- never loopback in a multi-node job ----------------------------------------------------
# Debian and Ubuntu map the host's own name to 127.0.1.1 in /etc/hosts (Debian Reference,
# "The hostname resolution": https://www.debian.org/doc/manuals/debian-reference/ch05.en.html#_the_hostname_resolution),
# so on the head node the head's name can resolve to loopback.

# The fake node is dual-homed: eth0 carries the default route, ens1f1 the cluster network
# (192.168.10.0/24); the other nodes reach the head on ens1f1.
PEER = Resolved(Head.named("node01", "a node of SLURM_STEP_NODELIST"), "192.168.10.2")


def test_a_dual_homed_head_whose_name_is_127_0_1_1_takes_the_interface_that_routes_to_another_node(node):
    node.route()
    plan = fabric_plan(node, head_address="master-node", head_lookup=("master-node", "127.0.1.1"), peer=PEER)
    values = {c.name: c for c in plan.changes}
    assert values["NCCL_SOCKET_IFNAME"].value == "ens1f1" and values["GLOO_SOCKET_IFNAME"].value == "ens1f1"
    assert values["NCCL_SOCKET_IFNAME"].reason == (
        "head node master-node resolves to loopback 127.0.1.1 here (/etc/hosts): the interface that routes to "
        "node01 (192.168.10.2, a node of SLURM_STEP_NODELIST), as the other nodes route to this one")


def test_a_dual_homed_head_that_cannot_tell_its_cluster_interface_is_refused_in_one_line(node):
    node.route()
    unresolved = Resolved(PEER.asked, None)
    with pytest.raises(LaunchError) as error:
        fabric_plan(node, head_address="master-node", head_lookup=("master-node", "127.0.1.1"), peer=unresolved)
    assert str(error.value) == (
        "head node master-node resolves to loopback 127.0.1.1 here (/etc/hosts) and node01 (a node of "
        "SLURM_STEP_NODELIST) did not resolve to a routed address, and this node has interfaces eth0, ens1f1: "
        "cannot tell which one the other nodes reach; map the name to the node's address on the cluster network "
        "in /etc/hosts, or set NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME to that interface")


def test_a_single_homed_head_whose_name_is_127_0_1_1_takes_its_only_interface(node):
    node.route(PROC_NET_ROUTE.splitlines()[0] + "\n" + "\n".join(PROC_NET_ROUTE.splitlines()[1:3]) + "\n")
    plan = fabric_plan(node, head_address="master-node", head_lookup=("master-node", "127.0.1.1"))
    values = {c.name: c for c in plan.changes}
    assert values["NCCL_SOCKET_IFNAME"].value == "eth0" and values["GLOO_SOCKET_IFNAME"].value == "eth0"
    assert "the only interface with a route" in values["NCCL_SOCKET_IFNAME"].reason


def test_loopback_head_with_no_other_route_is_refused_in_one_line(node):
    node.route(PROC_NET_ROUTE.splitlines()[0] + "\nlo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n")
    with pytest.raises(LaunchError, match=r"^head node master-node resolves to loopback 127\.0\.1\.1 here") as error:
        fabric_plan(node, head_address="master-node", head_lookup=("master-node", "127.0.1.1"))
    assert "\n" not in str(error.value) and "/etc/hosts" in str(error.value)


def test_loopback_head_is_fine_when_the_user_named_both_interfaces(node):
    node.route(PROC_NET_ROUTE.splitlines()[0] + "\n")
    plan = fabric_plan(node, env={"NCCL_SOCKET_IFNAME": "ens1f1", "GLOO_SOCKET_IFNAME": "ens1f1"},
                       head_address="master-node", head_lookup=("master-node", "127.0.1.1"))
    assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} & {c.name for c in plan.changes}


def test_a_users_loopback_interface_is_an_error_finding(node):
    node.route()
    plan = fabric_plan(node, env={"NCCL_SOCKET_IFNAME": "lo"}, head_address="192.168.10.1")
    assert [(f.topic, f.severity) for f in plan.findings if f.topic == "interface"] == [("interface", "error")]


def test_the_lookup_prefers_the_non_loopback_address(monkeypatch):
    # getaddrinfo on such a head node: the /etc/hosts line first, then DNS.
    from ddp_launch import rendezvous

    answers = [(2, 1, 6, "", ("127.0.1.1", 0)), (2, 1, 6, "", ("192.168.20.15", 0))]
    monkeypatch.setattr(rendezvous.socket, "getaddrinfo", lambda *args: answers)
    assert rendezvous.lookup_ipv4("master-node") == "192.168.20.15"
    monkeypatch.setattr(rendezvous.socket, "getaddrinfo", lambda *args: answers[:1])
    assert rendezvous.lookup_ipv4("master-node") == "127.0.1.1"


# NCCL_DEBUG=INFO on Ethernet as on the other fabrics: the trainer's transport check reads its log.
def test_ethernet_logs_nccls_network_choice_like_the_other_fabrics(node):
    node.route()
    values = {c.name: c.value for c in fabric_plan(node, head_address="192.168.10.1").changes}
    assert values["NCCL_DEBUG"] == "INFO" and values["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert values["NCCL_DEBUG_FILE"].endswith("nccl-local.%h.%p.log")
    assert values["DDP_EXPECT_FABRIC"] == "ethernet"


def test_ethernet_keeps_the_users_nccl_debug(node):
    node.route()
    changes = fabric_plan(node, env={"NCCL_DEBUG": "WARN"}, head_address="192.168.10.1").changes
    assert "NCCL_DEBUG" not in {c.name for c in changes}
