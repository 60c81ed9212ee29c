"""InfiniBand / RoCE: find the RDMA device and its IPv4 RoCE v2 GID index from /sys.

What EPFL RCP's grep one-liner does (seed 002), read from sysfs directly:
ports/<p>/gids/<n> holds the GID, ports/<p>/gid_attrs/types/<n> its type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from ddp_launch.fabric.common import EnvBuilder, list_dir, read_text

IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
RCP_SOURCE = "EPFL RCP RunAI multi-node guide (seed 002)"


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    port: str
    link_layer: Optional[str]   # "InfiniBand" or "Ethernet" (RoCE)
    roce_v2_ipv4_gid: Optional[int]

    @property
    def is_roce(self) -> bool:
        return self.link_layer == "Ethernet" or (self.link_layer is None and self.roce_v2_ipv4_gid is not None)


def rdma_device_names(root: str) -> Tuple[str, ...]:
    return list_dir(root, "/sys/class/infiniband") or ()


def roce_v2_ipv4_gid_index(root: str, device: str, port: str = "1") -> Optional[int]:
    """Lowest GID index on device/port that is an IPv4-mapped address of type RoCE v2."""
    base = f"/sys/class/infiniband/{device}/ports/{port}"
    indices = sorted(int(n) for n in (list_dir(root, f"{base}/gids") or ()) if n.isdigit())
    for index in indices:
        gid = (read_text(root, f"{base}/gids/{index}") or "").lower()
        if not gid.startswith(IPV4_MAPPED_PREFIX):
            continue
        # Unpopulated entries fail to read (EINVAL): read_text gives None and they are skipped.
        kind = read_text(root, f"{base}/gid_attrs/types/{index}") or ""
        if kind.strip().lower() == "roce v2":
            return index
    return None


def probe_device(root: str, name: str) -> RdmaDevice:
    ports = [p for p in (list_dir(root, f"/sys/class/infiniband/{name}/ports") or ()) if p.isdigit()]
    port = "1" if "1" in ports or not ports else ports[0]
    link_layer = read_text(root, f"/sys/class/infiniband/{name}/ports/{port}/link_layer")
    return RdmaDevice(name, port, link_layer, roce_v2_ipv4_gid_index(root, name, port))


def rdma_devices(root: str) -> Tuple[RdmaDevice, ...]:
    return tuple(probe_device(root, name) for name in rdma_device_names(root))


def choose_roce_device(devices: Tuple[RdmaDevice, ...]) -> Optional[RdmaDevice]:
    """The first RoCE device with an IPv4 RoCE v2 GID (the pod's RDMA network)."""
    for device in devices:
        if device.is_roce and device.roce_v2_ipv4_gid is not None:
            return device
    return None


def infiniband_defaults(builder: EnvBuilder, root: str, env: Mapping[str, str]) -> None:
    devices = rdma_devices(root)
    roce = choose_roce_device(devices)
    if roce is None:
        if any(d.is_roce for d in devices):
            builder.notes.append(
                "warning: RoCE device found but no IPv4 RoCE v2 GID; set NCCL_IB_GID_INDEX yourself "
                "(see /sys/class/infiniband/*/ports/1/gid_attrs/types)"
            )
        # Native InfiniBand: NCCL finds every HCA itself; pinning one would cut bandwidth.
        return
    builder.default("NCCL_IB_HCA", roce.name, f"{RCP_SOURCE}: the RDMA device in /sys/class/infiniband")
    builder.default(
        "NCCL_IB_GID_INDEX", str(roce.roce_v2_ipv4_gid),
        f"{RCP_SOURCE}: the IPv4-mapped RoCE v2 GID of {roce.name} port {roce.port}",
    )
    builder.default("NCCL_SOCKET_NTHREADS", "4", RCP_SOURCE)
    gpus = env.get("RUNAI_NUM_OF_GPUS", "")
    if gpus.isdigit() and int(gpus) > 0:
        # NCCL caps NSOCKS_PERTHREAD * SOCKET_NTHREADS at 64.
        builder.default("NCCL_NSOCKS_PERTHREAD", str(min(int(gpus), 16)), f"{RCP_SOURCE}: one socket per GPU ($RUNAI_NUM_OF_GPUS)")
