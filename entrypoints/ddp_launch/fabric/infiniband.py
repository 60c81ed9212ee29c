"""InfiniBand / RoCE: how a node shows it, and the RDMA device and its IPv4 RoCE v2 GID index, from the probed facts.

What EPFL RCP's grep one-liner does (github.com/epfml/getting-started, docs/multinode.md);
the sysfs reading is in facts.py, the fixed values in containers/sites/fabrics/infiniband.json.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp_launch.facts import NodeFacts, RdmaDevice
from ddp_launch.fabric.common import EnvBuilder, FabricJob
from ddp_launch.fabric.defaults import FabricDefaults
from ddp_launch.gpus import GrantVariables

RCP_SOURCE = "EPFL RCP RunAI multi-node guide (github.com/epfml/getting-started, docs/multinode.md)"
# NCCL caps NSOCKS_PERTHREAD * SOCKET_NTHREADS at 64; with 4 threads, 16 sockets each.
MAX_NSOCKS_PERTHREAD = 16

NAME = "infiniband"
TITLE = "InfiniBand/RoCE"
HIGH_SPEED = True
HAS_DEFAULTS = True
DEVICES = ("/sys/class/infiniband",)
# NCCL's built-in IB verbs transport, which NCCL_IB_DISABLE=1 turns off (NCCL's environment variables
# page: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-disable).
NCCL_IB_TRANSPORT = True
LIBFABRIC_PROVIDER = None
MISSING = "/sys/class/infiniband is empty"
MISSING_FIX = ("run on a node with an InfiniBand HCA (check the job's partition), or set NCCL_IB_DISABLE=1 "
               "to train over Ethernet sockets")
MISSING_FIX_IN_A_POD = ("on RunAI add --extended-resource rdma/rdma=1 and the roce network annotation (runai/submit.sh "
                        "adds them by default), or set NCCL_IB_DISABLE=1 in the pods to train without RoCE "
                        "(runai/submit.sh does when asked for no RDMA)")


def detect(facts: NodeFacts) -> bool:
    """RDMA devices in /sys/class/infiniband (InfiniBand HCAs and RoCE NICs alike)."""
    return bool(facts.rdma_devices)


def choose_roce_device(devices: tuple[RdmaDevice, ...]) -> RdmaDevice | None:
    """The first RoCE device with an IPv4 RoCE v2 GID (the pod's RDMA network)."""
    for device in devices:
        if device.is_roce and device.roce_v2_ipv4_gid is not None:
            return device
    return None


def infiniband_defaults(builder: EnvBuilder, defaults: FabricDefaults, facts: NodeFacts,
                        conditions: Mapping[str, object], env: Mapping[str, str], grant: GrantVariables) -> None:
    """RCP's settings for a RoCE device; grant: the scheduler's GPU variables, whose pod count sets the sockets."""
    roce = choose_roce_device(facts.rdma_devices)
    if roce is None:
        if any(d.is_roce for d in facts.rdma_devices):
            builder.note("roce", "warning",
                         "RoCE device found but no IPv4 RoCE v2 GID; set NCCL_IB_GID_INDEX yourself "
                         "(see /sys/class/infiniband/*/ports/1/gid_attrs/types)")
        # Native InfiniBand: NCCL finds every HCA itself; pinning one would cut bandwidth.
        return
    builder.default("NCCL_IB_HCA", roce.name, f"{RCP_SOURCE}: the RDMA device in /sys/class/infiniband")
    builder.default(
        "NCCL_IB_GID_INDEX", str(roce.roce_v2_ipv4_gid),
        f"{RCP_SOURCE}: the IPv4-mapped RoCE v2 GID of {roce.name} port {roce.port}",
    )
    for item in defaults.applicable(conditions):
        builder.default(item.name, item.value, item.source)
    for name in grant.pod_count:
        gpus = env.get(name, "")
        if gpus.isdigit() and int(gpus) > 0:
            builder.default("NCCL_NSOCKS_PERTHREAD", str(min(int(gpus), MAX_NSOCKS_PERTHREAD)),
                            f"{RCP_SOURCE}: one socket per GPU (${name})")
            return


def plan(builder: EnvBuilder, job: FabricJob) -> None:
    infiniband_defaults(builder, job.defaults, job.facts, job.conditions, job.request.env, job.request.gpu_grant)
