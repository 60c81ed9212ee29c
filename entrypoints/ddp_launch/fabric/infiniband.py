"""InfiniBand / RoCE: how a node shows it, and the RDMA device and this node's IPv4 RoCE v2 GID, from the probed facts.

What EPFL RCP's grep one-liner does (github.com/epfml/getting-started, docs/multinode.md);
the sysfs reading is in facts.py, the fixed values in containers/sites/fabrics/infiniband.json.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp_launch.facts import NodeFacts, RdmaDevice, RoceGid
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


# NCCL picks the RoCE GID itself since 2.21: NCCL_IB_GID_INDEX's default became -1, the GID of the address family
# NCCL_IB_ADDR_FAMILY (AF_INET) and RoCE version NCCL_IB_ROCE_VERSION_NUM (2), within NCCL_IB_ADDR_RANGE when set
# (NCCL's environment variables page, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-gid-index,
# "(since 2.21)"; NVIDIA/nccl src/transport/net_ib.cc, ncclIbGetGidIndex). Before 2.26.2 that choice stops with an
# error at a GID entry the container cannot read ("read failed in ncclIbRoceGetVersionNum: Invalid argument",
# NVIDIA/nccl#1573), which a pod's table has where other network namespaces' entries are hidden from it; 2.26.2
# skips them (net_ib.cc: "In containerized environments, read could return EINVAL"). From there on NCCL chooses;
# before, and where the image's NCCL cannot be told, the index of this pod's own GID is set, as RCP's guide does.
NCCL_CHOOSES_GID = (2, 26, 2)
NCCL_DYNAMIC_GID = (2, 21, 0)


def own_roce_gids(device: RdmaDevice, facts: NodeFacts) -> tuple[RoceGid, ...]:
    """device's IPv4 RoCE v2 GIDs that belong to this node (a pod: its network namespace).

    A GID belongs here when the interface the kernel names for it (gid_attrs/ndevs) is one of this
    node's (/sys/class/net shows its namespace's), and, where that interface's address is known,
    when the GID maps that address: a pod on a shared RDMA device may see the entries of the node's
    own interfaces and of other pods' (each Multus pod names its interface net1), and the lowest
    index is then another's, the same in two pods of one node. A GID the kernel names no interface
    for (older kernels have no gid_attrs/ndevs) is taken as the node's.
    """
    mine = []
    for gid in device.roce_v2_ipv4_gids:
        if gid.interface is not None:
            if facts.net_interfaces is not None and gid.interface not in facts.net_interfaces:
                continue
            if facts.interface_ipv4.get(gid.interface, gid.ipv4) != gid.ipv4:
                continue
        mine.append(gid)
    return tuple(mine)


def choose_roce_device(facts: NodeFacts) -> RdmaDevice | None:
    """The first RoCE device with an IPv4 RoCE v2 GID of this node's interfaces (the pod's RDMA network)."""
    for device in facts.rdma_devices:
        if device.is_roce and own_roce_gids(device, facts):
            return device
    return None


def _gid_text(gid: RoceGid) -> str:
    return f"GID {gid.index} ({gid.interface + ' ' if gid.interface else ''}{gid.ipv4})"


def _version(version: tuple[int, int, int]) -> str:
    return ".".join(str(part) for part in version)


def gid_choice(builder: EnvBuilder, device: RdmaDevice, facts: NodeFacts) -> None:
    """NCCL_IB_GID_INDEX, or NCCL's own choice kept to this node's GID, by the NCCL the workers load."""
    mine = own_roce_gids(device, facts)
    gid = mine[0]
    others = [other for other in device.roce_v2_ipv4_gids if other not in mine]
    where = f"{_gid_text(gid)} of {device.name} port {device.port}"
    nccl = facts.nccl
    if nccl is not None and nccl.version is not None and nccl.version >= NCCL_CHOOSES_GID:
        builder.note("roce", "info", f"NCCL_IB_GID_INDEX left to NCCL {_version(nccl.version)} ({nccl.path}), which "
                                     f"picks the IPv4 RoCE v2 GID itself (since 2.21, past unreadable entries since "
                                     f"2.26.2): here {where}")
        if others:
            builder.default("NCCL_IB_ADDR_RANGE", f"{gid.ipv4}/32",
                            f"NCCL's own GID choice kept to this node's {where}: the table also lists "
                            f"{', '.join(_gid_text(other) for other in others)}, not this node's (NCCL env docs, "
                            f"NCCL_IB_ADDR_RANGE, since 2.21)")
        return
    if nccl is None:
        why = "no libnccl.so.2 where the workers look, so NCCL's own choice cannot be counted on"
    elif nccl.version is None:
        why = f"{nccl.path}'s version is unknown, so NCCL's own choice cannot be counted on"
    elif nccl.version < NCCL_DYNAMIC_GID:
        why = f"NCCL {_version(nccl.version)} takes GID 0 unless told (its default before 2.21)"
    else:
        why = (f"NCCL {_version(nccl.version)} picks a GID itself, but before 2.26.2 stops at a GID entry a "
               f"pod cannot read (NVIDIA/nccl#1573)")
    owned = " of this node's interface (gid_attrs/ndevs)" if gid.interface else ""
    builder.default("NCCL_IB_GID_INDEX", str(gid.index),
                    f"{RCP_SOURCE}: the IPv4-mapped RoCE v2 {where}{owned}; {why}")


def infiniband_defaults(builder: EnvBuilder, defaults: FabricDefaults, facts: NodeFacts,
                        conditions: Mapping[str, object], env: Mapping[str, str], grant: GrantVariables) -> None:
    """RCP's settings for a RoCE device; grant: the scheduler's GPU variables, whose pod count sets the sockets."""
    roce = choose_roce_device(facts)
    if roce is None:
        foreign = [device for device in facts.rdma_devices if device.is_roce and device.roce_v2_ipv4_gids]
        if foreign:
            listed = "; ".join(f"{device.name}: " + ", ".join(_gid_text(gid) for gid in device.roce_v2_ipv4_gids)
                               for device in foreign)
            builder.note("roce", "warning",
                         f"the RoCE devices' IPv4 RoCE v2 GIDs belong to no interface of this node ({listed}); "
                         f"check that the pod has its RoCE network (the kube-system/roce annotation on RCP), or "
                         f"set NCCL_IB_GID_INDEX yourself")
        elif any(d.is_roce for d in facts.rdma_devices):
            builder.note("roce", "warning",
                         "RoCE device found but no IPv4 RoCE v2 GID; set NCCL_IB_GID_INDEX yourself "
                         "(see /sys/class/infiniband/*/ports/1/gid_attrs/types)")
        # Native InfiniBand: NCCL finds every HCA itself; pinning one would cut bandwidth.
        return
    builder.default("NCCL_IB_HCA", roce.name, f"{RCP_SOURCE}: the RDMA device in /sys/class/infiniband")
    gid_choice(builder, roce, facts)
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
