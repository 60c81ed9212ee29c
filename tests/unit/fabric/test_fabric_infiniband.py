"""RoCE/InfiniBand: device and IPv4 RoCE v2 GID index from fake /sys trees with the real layout."""

from __future__ import annotations

from fakes.node import RCP_GIDS, fabric_plan, node_facts

from ddp_launch.facts import roce_v2_ipv4_gid_index
from ddp_launch.schedulers import kubeflow


def env_for(node, env=None):
    """The plan for a RunAI pod: the planner hands the fabric its scheduler's GPU variables."""
    return {c.name: c.value for c in fabric_plan(node, env=env or {}, gpu_grant=kubeflow.GPU_GRANT).changes}


def test_gid_index_is_the_ipv4_mapped_roce_v2_entry(node):
    node.rdma("mlx5_bond_0", RCP_GIDS)
    assert roce_v2_ipv4_gid_index(str(node.root), "mlx5_bond_0") == 3


def test_gid_index_ignores_ipv6_roce_v2_and_ipv4_roce_v1(node):
    gids = {k: v for k, v in RCP_GIDS.items() if k != 3}
    node.rdma("mlx5_bond_0", gids)
    assert roce_v2_ipv4_gid_index(str(node.root), "mlx5_bond_0") is None


def test_gid_indices_compare_as_numbers(node):
    gids = {10: ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"), 9: ("fe80::", "RoCE v2")}
    node.rdma("mlx5_0", gids)
    assert roce_v2_ipv4_gid_index(str(node.root), "mlx5_0") == 10


def test_roce_pod_gets_rcp_settings(node):
    node.rdma("mlx5_bond_0", RCP_GIDS)
    env = env_for(node, {"RUNAI_NUM_OF_GPUS": "4"})
    assert env["NCCL_IB_HCA"] == "mlx5_bond_0"
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_SOCKET_NTHREADS"] == "4"
    assert env["NCCL_NSOCKS_PERTHREAD"] == "4"
    assert env["DDP_EXPECT_FABRIC"] == "infiniband"


def test_device_without_ipv4_gid_is_skipped_for_the_next(node):
    node.rdma("mlx5_0", {0: ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2")})
    node.rdma("mlx5_1", RCP_GIDS)
    env = env_for(node)
    assert env["NCCL_IB_HCA"] == "mlx5_1"


def test_native_infiniband_leaves_hca_choice_to_nccl(node):
    node.rdma("mlx5_0", {0: ("fe80:0000:0000:0000:0002:c903:0000:0001", "IB/RoCE v1")}, "InfiniBand")
    node.rdma("mlx5_1", {0: ("fe80:0000:0000:0000:0002:c903:0000:0002", "IB/RoCE v1")}, "InfiniBand")
    env = env_for(node)
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_GID_INDEX" not in env
    assert [d.name for d in node_facts(node).rdma_devices] == ["mlx5_0", "mlx5_1"]


def test_user_gid_index_wins(node):
    node.rdma("mlx5_bond_0", RCP_GIDS)
    env = env_for(node, {"NCCL_IB_GID_INDEX": "7"})
    assert "NCCL_IB_GID_INDEX" not in env


def test_roce_without_an_ipv4_gid_is_a_roce_warning(node):
    node.rdma("mlx5_0", {0: ("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2")})
    plan = fabric_plan(node)
    assert [(f.topic, f.severity) for f in plan.findings] == [("roce", "warning")]
    assert "NCCL_SOCKET_NTHREADS" not in {c.name for c in plan.changes}


def test_sixteen_gpus_and_more_get_the_capped_socket_count(node):
    node.rdma("mlx5_bond_0", RCP_GIDS)
    assert env_for(node, {"RUNAI_NUM_OF_GPUS": "32"})["NCCL_NSOCKS_PERTHREAD"] == "16"


def test_a_runai_pod_whose_nccl_goes_over_sockets_gets_the_socket_tuning(node):
    # RUNAI_RDMA=0: runai/submit.sh sets NCCL_IB_DISABLE=1, so NCCL's socket transport carries the data,
    # the one case where NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD act (NCCL env docs: "socket transport").
    node.rdma("mlx5_bond_0", RCP_GIDS)
    node.net("lo", "eth0", "net1")
    env = env_for(node, {"RUNAI_NUM_OF_GPUS": "8", "NCCL_IB_DISABLE": "1"})
    assert "NCCL_IB_HCA" not in env and "NCCL_IB_GID_INDEX" not in env
    assert (env["NCCL_SOCKET_NTHREADS"], env["NCCL_NSOCKS_PERTHREAD"]) == ("4", "8")
    assert env_for(node, {"RUNAI_NUM_OF_GPUS": "32", "NCCL_IB_DISABLE": "1"})["NCCL_NSOCKS_PERTHREAD"] == "16"


def test_cpu_workers_and_jobs_whose_scheduler_counts_no_pod_gpus_get_no_socket_tuning(node):
    node.net("lo", "eth0")
    assert "NCCL_SOCKET_NTHREADS" not in env_for(node, {"NCCL_IB_DISABLE": "1"})
    gloo = fabric_plan(node, env={"RUNAI_NUM_OF_GPUS": "4"}, gloo=True, gpu_grant=kubeflow.GPU_GRANT)
    assert "NCCL_SOCKET_NTHREADS" not in {c.name for c in gloo.changes}


# -- whose GID, and who chooses it ---------------------------------------------------------------

def plan_with(node, interface_ipv4=None, env=None, **facts_fields):
    """plan_fabric for a RunAI pod on the fake node, with the pod's interfaces' addresses (which the
    probe asks the kernel for, SIOCGIFADDR) given here."""
    from dataclasses import replace

    from ddp_launch.fabric import FabricRequest, plan_fabric
    from ddp_launch.fabric.defaults import read_fabric_data

    env = env or {"RUNAI_NUM_OF_GPUS": "4"}
    facts = replace(node_facts(node, env=env), interface_ipv4=interface_ipv4 or {}, **facts_fields)
    return plan_fabric(FabricRequest(env=env, multi_node=True, gpu_grant=kubeflow.GPU_GRANT), facts,
                       read_fabric_data(None, env))


def planned(plan) -> dict:
    return {c.name: c.value for c in plan.changes}


def test_a_gid_of_an_interface_the_pod_has_not_is_not_taken(node):
    # The node's own bond0 entries come first in the table the pod sees; the pod's RoCE network is net1.
    node.rdma("mlx5_bond_0", {2: ("0000:0000:0000:0000:0000:ffff:0a00:0005", "IB/RoCE v1", "bond0"),
                              3: ("0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2", "bond0"),
                              6: ("0000:0000:0000:0000:0000:ffff:ac12:8003", "IB/RoCE v1", "net1"),
                              7: ("0000:0000:0000:0000:0000:ffff:ac12:8003", "RoCE v2", "net1")})
    node.net("lo", "eth0", "net1")
    env = planned(plan_with(node))
    assert env["NCCL_IB_GID_INDEX"] == "7" and env["NCCL_IB_HCA"] == "mlx5_bond_0"


def test_two_pods_on_one_node_each_take_the_gid_of_their_own_address(node):
    # Both pods' entries are named net1: the address of this pod's net1 tells which is its own.
    from fakes.node import RCP_TWO_PODS_GIDS
    node.rdma("mlx5_bond_0", RCP_TWO_PODS_GIDS)
    node.net("lo", "eth0", "net1")
    first = planned(plan_with(node, {"eth0": "10.233.64.7", "net1": "172.18.128.3"}))
    second = planned(plan_with(node, {"eth0": "10.233.64.8", "net1": "172.18.128.4"}))
    assert (first["NCCL_IB_GID_INDEX"], second["NCCL_IB_GID_INDEX"]) == ("3", "8")


def test_no_gid_of_the_pods_own_interfaces_is_a_warning_and_nothing_is_pinned(node):
    node.rdma("mlx5_bond_0", {3: ("0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2", "bond0")})
    node.net("lo", "eth0")
    plan = plan_with(node)
    assert "NCCL_IB_GID_INDEX" not in planned(plan) and "NCCL_IB_HCA" not in planned(plan)
    assert [(f.topic, f.severity) for f in plan.findings] == [("roce", "warning")]
    assert "belong to no interface of this node (mlx5_bond_0: GID 3 (bond0 10.0.0.5))" in plan.findings[0].text


def nccl_at(node, directory: str, version: str) -> None:
    """libnccl.so.2 as NCCL's packages install it: a link to the file that carries the full version."""
    target = node.file(f"{directory}/libnccl.so.{version}", "NCCL stand-in\n")
    (target.parent / "libnccl.so.2").symlink_to(target.name)


def test_nccl_2_26_2_and_later_choose_the_gid_themselves(node):
    # NGC's image: NCCL from its package in /usr/lib/x86_64-linux-gnu, found where the loader looks.
    node.rdma("mlx5_bond_0", {index: (gid, kind, "net1") for index, (gid, kind) in RCP_GIDS.items() if kind})
    node.net("lo", "eth0", "net1")
    nccl_at(node, "/usr/lib/x86_64-linux-gnu", "2.27.3")
    plan = plan_with(node, {"net1": "172.18.128.3"})
    env = planned(plan)
    assert node_facts(node).nccl.version == (2, 27, 3)
    assert "NCCL_IB_GID_INDEX" not in env and "NCCL_IB_ADDR_RANGE" not in env and env["NCCL_IB_HCA"] == "mlx5_bond_0"
    assert [f.text for f in plan.findings if f.topic == "roce"] == [
        "NCCL_IB_GID_INDEX left to NCCL 2.27.3 (/usr/lib/x86_64-linux-gnu/libnccl.so.2), which picks the IPv4 RoCE "
        "v2 GID itself (since 2.21, past unreadable entries since 2.26.2): here GID 3 (net1 172.18.128.3) of "
        "mlx5_bond_0 port 1"]


def test_nccls_own_choice_is_kept_to_the_pods_address_where_the_table_lists_others(node):
    from fakes.node import RCP_TWO_PODS_GIDS
    node.rdma("mlx5_bond_0", RCP_TWO_PODS_GIDS)
    node.net("lo", "eth0", "net1")
    nccl_at(node, "/usr/lib/x86_64-linux-gnu", "2.27.3")
    env = planned(plan_with(node, {"net1": "172.18.128.4"}))
    assert "NCCL_IB_GID_INDEX" not in env and env["NCCL_IB_ADDR_RANGE"] == "172.18.128.4/32"


def test_older_or_unknown_nccl_gets_the_pods_gid_index_with_the_reason(node):
    node.rdma("mlx5_bond_0", RCP_GIDS)
    node.net("lo", "eth0", "net1")
    reasons = {}
    for version in ("2.19.3", "2.23.4"):
        tree = type(node)(node.root.parent / version)
        tree.rdma("mlx5_bond_0", RCP_GIDS)
        nccl_at(tree, "/usr/lib/x86_64-linux-gnu", version)
        change = next(c for c in plan_with(tree).changes if c.name == "NCCL_IB_GID_INDEX")
        reasons[version] = (change.value, change.reason.split("; ")[-1])
    change = next(c for c in plan_with(node).changes if c.name == "NCCL_IB_GID_INDEX")
    reasons["none"] = (change.value, change.reason.split("; ")[-1])
    assert reasons == {
        "2.19.3": ("3", "NCCL 2.19.3 takes GID 0 unless told (its default before 2.21)"),
        "2.23.4": ("3", "NCCL 2.23.4 picks a GID itself, but before 2.26.2 stops at a GID entry a pod cannot read "
                        "(NVIDIA/nccl#1573)"),
        "none": ("3", "no libnccl.so.2 where the workers look, so NCCL's own choice cannot be counted on")}


def test_the_workers_nccl_is_found_in_ld_library_path_then_the_pip_wheel_then_the_loaders_dirs(tmp_path):
    from fakes.node import FakeNode

    from ddp_launch.facts import find_nccl
    node = FakeNode(tmp_path / "node")
    nccl_at(node, "/usr/lib/x86_64-linux-gnu", "2.27.3")
    wheel = node.file("/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2", "NCCL stand-in\n")
    node.directory("/venv/lib/python3.12/site-packages/nvidia_nccl_cu12-2.21.5.dist-info")
    nccl_at(node, "/opt/host/nccl/lib", "2.18.1")
    root, site = str(node.root), "/venv/lib/python3.12/site-packages"
    assert find_nccl(root, ["/opt/host/nccl/lib"], [site]).version == (2, 18, 1)
    assert find_nccl(root, [], [site]).version == (2, 21, 5) and wheel.exists()
    assert find_nccl(root, [], []).path == "/usr/lib/x86_64-linux-gnu/libnccl.so.2"
    assert find_nccl(str(tmp_path / "empty"), [], []) is None


def test_doctor_warns_of_a_roce_device_with_no_gid_of_this_pods(node):
    from ddp_launch.doctor.fabric import check_fabric_settings
    from ddp_launch.doctor.report import WARN

    class Context:  # the one field check_fabric_settings reads besides the environment
        env = {}
    node.rdma("mlx5_bond_0", {3: ("0000:0000:0000:0000:0000:ffff:0a00:0005", "RoCE v2", "bond0")})
    node.net("lo", "eth0")
    Context.fabric = plan_with(node)
    check = check_fabric_settings(Context)
    assert check.status == WARN and "belong to no interface of this node" in check.detail
