"""The twins: the e2e SLURM cluster with a real cluster's facts, each job script's own site.

tests/e2e/cluster/twins/NAME.sh holds the facts cluster.sh builds from (node names, interfaces,
partitions, GPUs, the container command); here is the rest of each twin: the files its nodes have
and this machine lacks (host libraries as real ELF shared objects built with cc, with the real
sonames and DT_NEEDED chains; device files; /sys/class entries), the environment its module
system sets, and the image its scripts run. Each twin says what it cannot reproduce in its .sh.
"""
from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fakes.elf_tree import build_fake_olivia_host, build_library  # the unit tests' real ELF trees
from fakes.node import RCP_TWO_PODS_GIDS, FakeNode

REPO = Path(__file__).resolve().parents[2]
TWIN_FILES = REPO / "tests" / "e2e" / "cluster" / "twins"

# What stands in for the GPUs the twins' SLURM grants: CPU workers with gloo (ddp-launch
# --cpu-workers, read from the environment), which the launcher and the doctor take as
# training on CPU on purpose.
CPU_WORKERS = "2"
# The nodes declare the real nodes' cores (slurm.conf's config_overrides) on a machine of two, and
# task/none binds no task to its share: one thread a process, or LUMI's 16 tasks of 7 threads
# (OMP_NUM_THREADS from SLURM_CPUS_PER_TASK) spin on two cores. ddp-launch keeps a user's value.
THREADS = "1"


@dataclass(frozen=True)
class Twin:
    """One twin: its facts file, where it sits beside the session's cluster, what its nodes carry."""

    name: str                       # tests/e2e/cluster/twins/<name>.sh
    slot: int                       # its prefix, subnets, ports and state differ from the session's by this
    nodes: int                      # how many of the twin's nodes to start
    tree: Callable[[Path], None]    # fills the node tree: root/ (host paths), dev/, sys/class/
    module_env: Mapping[str, str] = field(default_factory=dict)   # what the site's `module load` sets

    @property
    def facts(self) -> Path:
        return TWIN_FILES / f"{self.name}.sh"


def _dirs(root: Path, *paths: str) -> None:
    for path in paths:
        (root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)


def _device_files(tree: Path, *names: str) -> None:
    """Empty files named as the devices whose names are all the probes read (/dev/cxi*, /dev/kfd):
    their drivers' majors are dynamic, and a node of a number this machine gave to another driver
    could open a real device."""
    for name in names:
        path = tree / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


# The GPUs' device numbers, fixed by their drivers: NVIDIA's 195 (/dev/nvidia<N> minor N,
# /dev/nvidiactl 255), DRM's 226 (render nodes from minor 128) (the kernel's
# Documentation/admin-guide/devices.txt; NVIDIA's driver README, "Device files").
NVIDIA_MAJOR, DRM_MAJOR = 195, 226


def _gpu_devices(tree: Path, *devices: tuple[str, int, int]) -> None:
    """Character devices with the GPUs' real numbers: gres.conf(5)'s File= must name character or
    block devices ("is not a valid character or block device, fix your gres.conf", slurmd says of
    anything else). No driver here answers them: opening one fails (ENXIO), as torch's CUDA and
    HIP never try without their libraries."""
    for name, major, minor in devices:
        path = tree / "dev" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def _nvidia(count: int) -> list[tuple[str, int, int]]:
    return [(f"nvidia{i}", NVIDIA_MAJOR, i) for i in range(count)] + [("nvidiactl", NVIDIA_MAJOR, 255)]


# -- Olivia ------------------------------------------------------------------------------------

# The NRIS modules are EasyBuild's, installed under /cluster/software/<name>/<version> on Sigma2's
# clusters; `module load NRIS/GPU NCCL` brings NCCL with the AWS OFI plugin (the olivia site
# profile's hints; Sigma2 documentation hpc_machines/olivia/nccl_apptainer.md binds
# $EBROOTAWSMINOFIMINNCCL/lib).
OLIVIA_NCCL = "/cluster/software/NCCL/2.27.7-GCCcore-14.2.0-CUDA-12.8.0"
OLIVIA_OFI_VERSION = "1.16.3"
OLIVIA_OFI = f"/cluster/software/aws-ofi-nccl/{OLIVIA_OFI_VERSION}-GCCcore-14.2.0-CUDA-12.8.0"


def olivia_tree(tree: Path) -> None:
    """An Olivia accel node: the unit tests' fake HPE Cray EX host (libcxi in /usr/lib64, libfabric
    under /opt/cray/libfabric/2.3.1, HOST_NCCL_PATH's NCCL and plugin, their closure), the NCCL
    module's NCCL and OFI plugin under /cluster/software, one Slingshot NIC and four GPUs."""
    host = build_fake_olivia_host(tree / "root")
    libraries = host["libraries"]
    build_library(tree / "root" / OLIVIA_NCCL.lstrip("/") / "lib/libnccl.so.2", "libnccl.so.2",
                  source="int ncclGetVersion(int *v) { *v = 22707; return 0; }\n")
    # The package string aws-ofi-nccl logs at start-up ("Initializing " PACKAGE_STRING, src/nccl_ofi_net.cpp),
    # from which the doctor and provenance read its version.
    build_library(tree / "root" / OLIVIA_OFI.lstrip("/") / "lib/libnccl-net.so", "libnccl-net.so",
                  needs=[libraries["libfabric.so.1"], libraries["libfakehwloc.so.15"]],
                  rpath=["/opt/fakevendor/hwloc/lib"],
                  source=f'const char *nccl_ofi_package = "Initializing aws-ofi-nccl {OLIVIA_OFI_VERSION}";\n')
    _device_files(tree, "cxi0")
    _gpu_devices(tree, *_nvidia(4))
    _dirs(tree, "sys/class/cxi/cxi0")


OLIVIA = Twin("olivia", slot=1, nodes=3, tree=olivia_tree, module_env={
    "EBROOTNCCL": OLIVIA_NCCL,
    "EBROOTAWSMINOFIMINNCCL": OLIVIA_OFI,
    "LD_LIBRARY_PATH": f"{OLIVIA_OFI}/lib:{OLIVIA_NCCL}/lib",
})


# -- LUMI --------------------------------------------------------------------------------------

LUMI_LIBFABRIC = "/opt/cray/libfabric/1.22.0"


def lumi_tree(tree: Path) -> None:
    """A LUMI-G node: the host paths LUMI's lumi-aif-singularity-bindings module binds (the lumi
    site profile: /opt/cray with the HPE libfabric, /usr/lib64/libcxi.so.1 and libjansson.so.4 it
    links, the file systems), four Slingshot NICs, the GCDs' render nodes and /dev/kfd."""
    root = tree / "root"
    jansson = build_library(root / "usr/lib64/libjansson.so.4.14.0", "libjansson.so.4")
    (root / "usr/lib64/libjansson.so.4").symlink_to("libjansson.so.4.14.0")
    cxi = build_library(root / "usr/lib64/libcxi.so.1", "libcxi.so.1", needs=[jansson])
    build_library(root / LUMI_LIBFABRIC.lstrip("/") / "lib64/libfabric.so.1", "libfabric.so.1", needs=[cxi],
                  source="unsigned int fi_version(void) { return (1u << 16) | 22u; }\n")
    _dirs(root, "/var/spool/slurmd", "/pfs", "/scratch", "/projappl", "/project", "/flash", "/appl")
    _device_files(tree, "cxi0", "cxi1", "cxi2", "cxi3", "kfd")
    _gpu_devices(tree, *[(f"dri/renderD{128 + i}", DRM_MAJOR, 128 + i) for i in range(8)])
    _dirs(tree, *[f"sys/class/cxi/cxi{i}" for i in range(4)])


LUMI = Twin("lumi", slot=2, nodes=2, tree=lumi_tree)


def lumi_image_tree(tree: Path) -> dict:
    """What LUMI's base image adds to the test base, laid out as the LUMI AI Factory's: libfabric and
    libcxi built with --libdir /usr/lib/x86_64-linux-gnu and found through ld.so.conf after
    ldconfig, with no LD_LIBRARY_PATH (lumi-ai-factory/laifs-container-recipes,
    containerfiles/libfabric/Ubuntu_Rocm_Slingshot); RCCL and its libfabric plugin in /opt/rocm/lib,
    listed by /etc/ld.so.conf.d/rocm-30.conf (containerfiles/rocm/Ubuntu2404_Rocm7), as the unit
    tests' laifs_image (tests/unit/doctor/test_doctor_amd.py). Returns {image path: built file}."""
    multiarch = "usr/lib/x86_64-linux-gnu"
    cxi = build_library(tree / multiarch / "libcxi.so.1", "libcxi.so.1")
    fabric = build_library(tree / multiarch / "libfabric.so.1", "libfabric.so.1", needs=[cxi],
                           source="unsigned int fi_version(void) { return (2u << 16) | 1u; }\n")
    rccl = build_library(tree / "opt/rocm/lib/librccl.so.1", "librccl.so.1",
                         source="int ncclGetVersion(int *v) { *v = 22203; return 0; }\n")
    plugin = build_library(tree / "opt/rocm/lib/librccl-net.so", "librccl-net.so", needs=[fabric])
    conf = tree / "etc/ld.so.conf.d/rocm-30.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("/opt/rocm/lib\n")
    return {f"/{path.relative_to(tree)}": path for path in (cxi, fabric, rccl, plugin, conf)}


# -- Raven -------------------------------------------------------------------------------------

def raven_tree(tree: Path) -> None:
    """A Raven GPU node: its InfiniBand HCA in /sys/class/infiniband (link layer InfiniBand, read by
    the fabric probe) and four GPUs."""
    node = FakeNode(tree)
    node.file("/sys/class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand\n")
    node.file("/sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n")
    _gpu_devices(tree, *_nvidia(4))


RAVEN = Twin("raven", slot=3, nodes=3, tree=raven_tree)


# -- the plain-Ethernet cluster ----------------------------------------------------------------

def ethernet_tree(tree: Path) -> None:
    _gpu_devices(tree, *_nvidia(1))


ETHERNET = Twin("ethernet", slot=4, nodes=6, tree=ethernet_tree)


# -- RCP's RunAI pods --------------------------------------------------------------------------

def rcp_tree(tree: Path) -> None:
    """RunAI pods on RCP: the RDMA device of their rdma/rdma=1 resource, RoCE, with the GID table of a
    real port (tests/fakes/node.py's RCP_GIDS: mlx5_bond_0) as two pods of one node see it, each
    pod's entries on its net1 (RCP_TWO_PODS_GIDS: the first pod's 172.18.128.3, the second's .4, the
    addresses rcp.sh gives the twin's net1)."""
    FakeNode(tree).rdma("mlx5_bond_0", RCP_TWO_PODS_GIDS)


RCP = Twin("rcp", slot=6, nodes=2, tree=rcp_tree)


def build_tree(twin: Twin, tree: Path) -> Path:
    """twin's node tree under tree (made anew), readable by the test user who runs the jobs."""
    subprocess.run(["rm", "-rf", str(tree)], check=True)
    tree.mkdir(parents=True)
    twin.tree(tree)
    subprocess.run(["chmod", "-R", "a+rX", str(tree)], check=True)
    return tree


def cluster_settings(twin: Twin, prefix: str, subnet: str, port: int, state: Path) -> dict:
    """cluster.sh's variables for twin beside a cluster of prefix, subnet, port and state: its own
    prefix (interface names stay under 15 characters), a /24 pair of its own, two ports of its own."""
    a, b, c = subnet.split(".")
    third = int(c) + 2 * twin.slot
    if third > 254:
        raise ValueError(f"DDP_E2E_SUBNET={subnet} leaves no room for twin {twin.name}'s subnets")
    return {"DDP_E2E_TWIN": twin.name, "DDP_E2E_PREFIX": f"{prefix}{twin.name[0]}{twin.slot}",
            "DDP_E2E_SUBNET": f"{a}.{b}.{third}", "DDP_E2E_UPLINK_SUBNET": f"{a}.{b}.{third + 1}",
            "DDP_E2E_PORT": str(port + 2 * twin.slot), "DDP_E2E_STATE": f"{state}-{twin.name}",
            "DDP_E2E_TWIN_TREE": f"{state}-{twin.name}-tree"}


def job_env(twin: Twin) -> dict:
    """What a user of twin's cluster has set before sbatch, beyond the job's own settings: the
    site's modules, and the CPU workers that stand in for its GPUs."""
    return {**twin.module_env, "DDP_LAUNCH_CPU_WORKERS": CPU_WORKERS, "OMP_NUM_THREADS": THREADS}


