"""--dry-run text of the reference setups' plans against recorded files: any change shows as a line diff.

The first four plan on a node built by hand (Ethernet: no fabric devices). The fabric goldens
plan on a fake node tree probed as `ddp-launch` probes "/" (planner.probe with a root, the hook
the fabric and doctor tests use): Olivia on a CXI node, LUMI on a CXI node with AMD GPUs, Raven
on InfiniBand, RCP on RoCE. They
pin every fabric variable, its value and its reason, and the LD_LIBRARY_PATH order of the binds;
the Olivia host's APPTAINER_BIND (`ddp-launch binds`) is pinned beside them.
"""

from __future__ import annotations

import difflib
import io
import os
from pathlib import Path

import pytest

from fakes.elf_tree import build_fake_olivia_host
from fakes.node import RCP_GIDS, FakeNode

from launch_envs import kubeflow_elastic, lumi_task, olivia, plan_for, plan_on_tree, raven, runai

from ddp_launch import binds  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
ACCEPT = f"UPDATE_GOLDEN=1 python -m pytest {os.path.relpath(__file__)}"

CASES = {
    "olivia_head": (olivia(0), ("--", "--epochs", "100", "--batch-size", "2048")),
    "olivia_worker": (olivia(1), ()),
    "raven_task5": (raven(5), ("--", "--batch-size", "256")),
    "runai_worker": (runai(1), ()),
}


def check_against_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    expected = path.read_text() if path.exists() else ""
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            str(path), "this run"))
        pytest.fail(f"--dry-run plan changed:\n{diff}\nIf the change is intended, accept it with:\n"
                    f"  {ACCEPT}", pytrace=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_dry_run_text_matches_the_recorded_plan(name):
    env, argv = CASES[name]
    check_against_golden(name, plan_for(env, *argv).render_text() + "\n")


def test_an_elastic_kubeflow_worker_pod_matches_its_recorded_plan():
    # A pod of an elastic PyTorchJob with elasticPolicy.rdzvConf join_timeout=1800: no rank, no MASTER_*.
    env, hostname = kubeflow_elastic(1)
    plan = plan_for({**env, "PET_RDZV_CONF": "join_timeout=1800"}, hostname=hostname)
    check_against_golden("kubeflow_elastic_worker", plan.render_text() + "\n")


# -- fabric nodes: fake /dev and /sys trees, and the container's bound host libraries --------

def gpus(node: FakeNode, count: int = 4) -> None:
    for index in range(count):
        node.file(f"/dev/nvidia{index}")
    node.file("/dev/nvidiactl")


def olivia_cxi_node(node: FakeNode) -> None:
    """An Olivia GH200 node inside the container, after `ddp-launch binds --site olivia`.

    Four CXI NICs (/dev/cxi*, /sys/class/cxi) with their hsn0-3 interfaces beside nmn0 and lo
    (HPE Cray EX naming); the host libraries where the olivia profile binds them (stand-in
    files: the launch probes directories and the plugin's file name, never the ELF); the
    NGC image's own library directories (Ubuntu, aarch64, /lib a link to usr/lib).
    """
    node.cxi(4)
    gpus(node)
    node.file("/opt/aws-ofi-nccl/lib/libnccl-net.so", "OFI NCCL plugin stand-in\n")
    node.file("/opt/libfabric/lib64/libfabric.so.1", "libfabric stand-in\n")
    node.file("/opt/libfabric/include/rdma/fabric.h", "/* libfabric header stand-in */\n")
    node.file("/opt/nccl/lib/libnccl.so.2", "NCCL stand-in\n")
    node.file("/opt/host-libs/libcxi.so.1", "libcxi stand-in\n")
    node.file("/opt/host-libs/libjson-c.so.5", "closure stand-in\n")
    node.file("/opt/nvidia/hpc_sdk/lib/libnvhpcatm.so", "HPC SDK runtime stand-in\n")
    node.directory("/usr/lib/aarch64-linux-gnu")
    node.root.joinpath("lib").symlink_to("usr/lib")


def amd_gpus(node: FakeNode, count: int = 8) -> None:
    """/dev/kfd and one /dev/dri/renderD<N> per GPU (N from 128), beside the card<N> nodes that
    must not count (ROCm docs, Docker and ROCm: the devices a container needs)."""
    node.file("/dev/kfd")
    for index in range(count):
        node.file(f"/dev/dri/renderD{128 + index}")
        node.file(f"/dev/dri/card{index}")


def lumi_cxi_node(node: FakeNode) -> None:
    """A LUMI-G node inside the container, after `ddp-launch binds --site lumi`: four CXI NICs
    with hsn0-3, eight MI250X GCDs, the host files bound where lumi-aif-singularity-bindings
    binds them (same paths), and an image that installs aws-ofi-rccl's plugin in /usr/lib64."""
    node.cxi(4)
    amd_gpus(node)
    node.file("/opt/cray/libfabric/1.15.2.0/lib64/libfabric.so.1", "libfabric stand-in\n")
    node.file("/usr/lib64/libcxi.so.1", "libcxi stand-in\n")
    node.file("/usr/lib64/libjansson.so.4", "libjansson stand-in\n")
    node.file("/usr/lib64/librccl-net.so", "aws-ofi-rccl plugin stand-in\n")
    node.file("/opt/rocm/lib/librccl.so.1", "RCCL stand-in\n")


def raven_infiniband_node(node: FakeNode) -> None:
    """A Raven A100 node: two Mellanox HCAs on native InfiniBand (link layer InfiniBand,
    only link-local GIDs, as an IB port shows them), ib0/ib1, no Slingshot devices."""
    gpus(node)
    for index in range(2):
        gid = f"fe80:0000:0000:0000:0c42:a103:00a1:b2c{index}"
        node.rdma(f"mlx5_{index}", {0: (gid, "IB/RoCE v1")}, link_layer="InfiniBand")
        node.file(f"/dev/infiniband/uverbs{index}")
    node.net("lo", "eno1", "ib0", "ib1")


def rcp_roce_node(node: FakeNode) -> None:
    """An RCP RunAI pod with the kube-system/roce network and rdma/rdma=1: mlx5_bond_0 with
    link layer Ethernet and its real GID table (IPv4 RoCE v2 at index 3), eth0 and net1."""
    gpus(node)
    node.rdma("mlx5_bond_0", RCP_GIDS, link_layer="Ethernet")
    node.file("/dev/infiniband/uverbs0")
    node.net("lo", "eth0", "net1")


# srun --network from the Slingshot site profiles' srun_args, which slurm/lib/ddp.sh also puts into the
# training step's environment (srun reads SLURM_NETWORK as --network, srun(1)); FI_CXI_RDZV_PROTO needs it.
SLINGSHOT_STEP = {"SLURM_NETWORK": "disable_rdzv_get"}

FABRIC_CASES = {
    # name: (tree, environment, argv, machine)
    "olivia_cxi_head": (olivia_cxi_node, {**olivia(0), **SLINGSHOT_STEP}, ("--site", "olivia", "--", "--epochs", "100"),
                        "aarch64"),
    # slurm/lumi-multinode.sh's step: one task per GCD (--mode slurm-task), rank 5 on the head node.
    "lumi_cxi_task5": (lumi_cxi_node, {**lumi_task(5), **SLINGSHOT_STEP}, ("--site", "lumi", "--mode", "slurm-task"),
                       "x86_64"),
    "raven_infiniband_task5": (raven_infiniband_node, raven(5), ("--site", "raven"), "x86_64"),
    "rcp_roce_worker": (rcp_roce_node, runai(1), ("--site", "rcp"), "x86_64"),
}


@pytest.fixture
def fabric_node(request, tmp_path) -> Path:
    """The fake tree of the case's node, built afresh under tmp_path."""
    node = FakeNode(tmp_path / "node")
    FABRIC_CASES[request.param][0](node)
    return node.root


@pytest.mark.parametrize("name, fabric_node", [(n, n) for n in sorted(FABRIC_CASES)], indirect=["fabric_node"],
                         ids=sorted(FABRIC_CASES))
def test_fabric_dry_run_text_matches_the_recorded_plan(name, fabric_node):
    _, env, argv, machine = FABRIC_CASES[name]
    text = plan_on_tree(env, fabric_node, *argv, machine=machine).render_text() + "\n"
    # The tree's tmp path must never reach the plan; if it did, it shows as <fake-root> in the diff.
    check_against_golden(name, text.replace(str(fabric_node), "<fake-root>"))


# -- the host side of the Olivia plan: what `ddp-launch binds --site olivia` binds, and where ---

def test_olivia_host_binds_match_the_recorded_value(tmp_path):
    """APPTAINER_BIND for a fake HPE Cray EX host (real ELF files built with cc, elf_tree.py):
    libfabric's versioned directory, the NCCL directory that holds the OFI plugin, libcxi as one
    file, and the host closure each as one file beside it. The launch plan above expects them there."""
    host = build_fake_olivia_host(tmp_path / "host")
    out, err = io.StringIO(), io.StringIO()
    assert binds.run(["--site", "olivia", "--root", str(host["root"])], {}, out, err) == 0, err.getvalue()
    entries = "\n".join(out.getvalue().strip().split(","))
    text = f"APPTAINER_BIND, one entry a line:\n{entries}\nstderr:\n{err.getvalue()}"
    check_against_golden("olivia_cxi_host_binds", text.replace(str(host["root"]), "<host-root>"))
