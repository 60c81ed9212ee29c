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
