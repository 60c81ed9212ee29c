"""The probe: read this node once (CPUs, device files, fabric devices, routes, one DNS answer) into NodeFacts.

Everything after it is pure: the planner, the fabric rules and doctor's checks take a
NodeFacts value, so tests build one by hand (or probe a fake tree under `root`).
"""

from __future__ import annotations

import os
import re
import socket
import struct
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ddp_launch import mr_monitor
from ddp_launch.accelerators import Accelerator
from ddp_launch.rendezvous import Head, ipv4_literal, is_loopback

IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
RTF_UP = 0x1
# Where dlopen looks after LD_LIBRARY_PATH: ld.so.cache, built from /etc/ld.so.conf(.d), and the
# trusted directories (ld.so(8), "Shared libraries are searched ..."), with Debian's multiarch ones.
LOADER_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64",
               "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
               "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
LD_SO_CONF_DIR = "/etc/ld.so.conf.d"


@dataclass(frozen=True)
class RoceGid:
    """One IPv4-mapped RoCE v2 entry of a port's GID table, and the network interface it belongs to."""

    index: int
    ipv4: str                       # the address it maps (::ffff:a.b.c.d)
    interface: str | None           # gid_attrs/ndevs/<index>; None where the kernel does not say


@dataclass(frozen=True)
class RdmaDevice:
    """One entry of /sys/class/infiniband: its port, link layer and IPv4 RoCE v2 GIDs, if any."""

    name: str
    port: str
    link_layer: str | None          # "InfiniBand", or "Ethernet" for RoCE
    roce_v2_ipv4_gid: int | None    # the lowest index of roce_v2_ipv4_gids
    roce_v2_ipv4_gids: tuple[RoceGid, ...] = ()

    @property
    def is_roce(self) -> bool:
        return self.link_layer == "Ethernet" or (self.link_layer is None and self.roce_v2_ipv4_gid is not None)


@dataclass(frozen=True)
class NcclLibrary:
    """The libnccl.so.2 the workers will load, where the launcher found it, and its version (None: unknown)."""

    path: str
    version: tuple[int, int, int] | None


@dataclass(frozen=True)
class Route:
    """One usable row of the kernel's IPv4 routing table (/proc/net/route)."""

    interface: str
    destination: int
    mask: int
    metric: int


@dataclass(frozen=True)
class ProbeQuestions:
    """What the plan will need to know about this node beyond the environment.

    The scheduler asks the first three (schedulers/__init__.py), the planner the rest.
    """

    head: Head | None = None                # the rendezvous host to look up (when it has no problem)
    peer: tuple[str, str] | None = None     # (name, where from) of another node: looked up (and its
                                            # name checked) only when head answers loopback here
    cuda: bool = False                      # can the vendor's driver use the GPUs the scheduler granted
    dns_wait_s: float | None = None         # retry the lookup this long (a pod's DNS record comes late)
    directories: tuple[str, ...] = ()       # does each exist (the fabric's library and plugin dirs)
    files: tuple[str, ...] = ()             # does each exist (the --script)
    plugin_dirs: tuple[str, ...] | None = None  # where to look for NCCL's net plugin (on a Slingshot node)
    loader_dirs: bool = False               # list the image's own library dirs (a site binds host libraries)
    accelerator: Accelerator | None = None  # whose device files to count, driver to ask, net plugin to look for


@dataclass(frozen=True)
class Resolved:
    """The one name lookup of a launch: the head asked about, as the scheduler named it (with
    where from, for the plan's messages), and its IPv4 address (None: no answer, or a name no
    resolver takes, which is never looked up)."""

    asked: Head
    address: str | None

    @property
    def name(self) -> str:
        return self.asked.name


@dataclass(frozen=True)
class NetPlugin:
    """Where the collective's net plugin (libnccl-net.so, librccl-net.so) lies on this node, looked
    for on a Slingshot node."""

    file: str                   # the file looked for: what NCCL / RCCL dlopens when NCCL_NET_PLUGIN is unset
    in_dirs: tuple[str, ...]    # of the directories asked about (LD_LIBRARY_PATH, the site's)
    by_loader: bool             # in a directory dlopen searches by itself (ld.so.cache, /usr/lib...)


@dataclass(frozen=True)
class NodeFacts:
    python: str = "python3"                     # sys.executable: workers run the launcher's interpreter
    cpu_count: int = 1                          # CPUs this process may run on (sched_getaffinity)
    machine: str = "x86_64"                     # os.uname().machine, what platform.machine() returns
    hostname: str = ""                          # os.uname().nodename, what gethostname() returns (a pod's name)
    gpu_device_files: int = 0                   # the vendor's: /dev/nvidia[0-9]*, /dev/dri/renderD*
    cxi_devices: tuple[str, ...] = ()           # /dev/cxi*
    cxi_class: bool = False                     # /sys/class/cxi exists
    rdma_devices: tuple[RdmaDevice, ...] = ()   # /sys/class/infiniband/*
    net_interfaces: tuple[str, ...] | None = None   # /sys/class/net; None when it cannot be listed
    routes: tuple[Route, ...] = ()              # /proc/net/route
    existing_dirs: frozenset[str] = field(default_factory=frozenset)  # of the directories asked about
    existing_files: frozenset[str] = field(default_factory=frozenset)  # of the files asked about (the --script)
    readable_files: frozenset[str] = field(default_factory=frozenset)  # of those, the ones this user may read
    cwd: str = "/"                              # os.getcwd(): where a relative --script is looked for
    head: Resolved | None = None                # the rendezvous host's lookup, when one was asked
    peer: Resolved | None = None                # another node's, when the head's name is loopback here
    cuda_problem: str | None = None             # why the driver (CUDA, HIP) cannot be used, when it was asked
    net_plugin: NetPlugin | None = None         # None: not looked for (no CXI, or not asked)
    loader_dirs: tuple[str, ...] = ()           # of LOADER_DIRS, those that exist (the image's own), when asked
    # On a Slingshot node with /dev/kdreg2: the memory-registration monitor the libfabric the workers load
    # uses when FI_MR_CACHE_MONITOR is unset (mr_monitor.default_monitor); None elsewhere or where it cannot tell.
    libfabric_monitor: str | None = None
    interface_ipv4: Mapping[str, str] = field(default_factory=dict)  # each interface's IPv4 address, on a RoCE node
    nccl: NcclLibrary | None = None             # on a RoCE node, the NCCL the workers will load (None: none found)

    @property
    def slingshot_present(self) -> bool:
        return bool(self.cxi_devices) or self.cxi_class

    @property
    def kdreg2_default(self) -> bool:
        """The host's libfabric defaults to kdreg2 and the kdreg2 module is loaded (only then is it read)."""
        return self.libfabric_monitor == mr_monitor.KDREG2

    @property
    def hsn_interfaces(self) -> tuple[str, ...] | None:
        """hsn* interfaces (Slingshot NICs), or None when /sys/class/net cannot be listed."""
        if self.net_interfaces is None:
            return None
        return tuple(name for name in self.net_interfaces if name.startswith("hsn"))

    def address_of(self, host: str) -> str | None:
        """host's IPv4 address from the one lookup (an address is its own answer)."""
        literal = ipv4_literal(host)
        if literal is not None:
            return literal
        return self.head.address if self.head is not None and self.head.name == host else None


# -- readers under a root ("/" on a node, a fake tree in tests) --------------------------

def under(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def list_dir(root: str, path: str) -> tuple[str, ...] | None:
    """Sorted entries of a directory, or None when it cannot be listed."""
    try:
        return tuple(sorted(os.listdir(under(root, path))))
    except OSError:
        return None


def read_text(root: str, path: str) -> str | None:
    try:
        with open(under(root, path), encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _hex_le(value: str) -> int:
    """/proc/net/route prints addresses as host-order (little-endian) hex."""
    return struct.unpack("<I", struct.pack(">I", int(value, 16)))[0]


def parse_routes(text: str) -> tuple[Route, ...]:
    routes = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            if not int(fields[3], 16) & RTF_UP:
                continue
            routes.append(Route(fields[0], _hex_le(fields[1]), _hex_le(fields[7]), int(fields[6])))
        except ValueError:
            continue
    return tuple(routes)


def roce_v2_ipv4_gids(root: str, device: str, port: str = "1") -> tuple[RoceGid, ...]:
    """The GID entries on device/port that are IPv4-mapped addresses of type RoCE v2, by index, each
    with the interface it belongs to.

    What EPFL RCP's grep one-liner reads (github.com/epfml/getting-started, docs/multinode.md), from
    sysfs directly: ports/<p>/gids/<n> holds the GID, gid_attrs/types/<n> its type and
    gid_attrs/ndevs/<n> the name of its network device (the kernel's sysfs ABI,
    Documentation/ABI/stable/sysfs-class-infiniband). A pod on a shared RDMA device can see entries
    of interfaces that are not its own (the node's, another pod's): which one is this pod's is the
    fabric's rule (fabric/infiniband.py).
    """
    base = f"/sys/class/infiniband/{device}/ports/{port}"
    indices = sorted(int(n) for n in (list_dir(root, f"{base}/gids") or ()) if n.isdigit())
    found = []
    for index in indices:
        gid = (read_text(root, f"{base}/gids/{index}") or "").lower()
        if not gid.startswith(IPV4_MAPPED_PREFIX):
            continue
        # Unpopulated entries, and in a container those of other network namespaces, fail to read
        # (EINVAL): read_text gives None and they are skipped.
        kind = read_text(root, f"{base}/gid_attrs/types/{index}") or ""
        if kind.strip().lower() != "roce v2":
            continue
        packed = gid[len(IPV4_MAPPED_PREFIX):].replace(":", "")
        try:
            address = socket.inet_ntoa(bytes.fromhex(packed))
        except (ValueError, OSError):
            continue
        found.append(RoceGid(index, address, read_text(root, f"{base}/gid_attrs/ndevs/{index}") or None))
    return tuple(found)


def roce_v2_ipv4_gid_index(root: str, device: str, port: str = "1") -> int | None:
    """Lowest GID index on device/port that is an IPv4-mapped address of type RoCE v2."""
    gids = roce_v2_ipv4_gids(root, device, port)
    return gids[0].index if gids else None


def probe_rdma_device(root: str, name: str) -> RdmaDevice:
    ports = [p for p in (list_dir(root, f"/sys/class/infiniband/{name}/ports") or ()) if p.isdigit()]
    port = "1" if "1" in ports or not ports else ports[0]
    link_layer = read_text(root, f"/sys/class/infiniband/{name}/ports/{port}/link_layer")
    gids = roce_v2_ipv4_gids(root, name, port)
    return RdmaDevice(name, port, link_layer, gids[0].index if gids else None, gids)


# SIOCGIFADDR, netdevice(7): an interface's (first) IPv4 address.
SIOCGIFADDR = 0x8915


def interface_ipv4(name: str) -> str | None:
    """name's IPv4 address in this network namespace, or None (no address, no such interface)."""
    import fcntl  # noqa: PLC0415 - only on a RoCE node
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
            answer = fcntl.ioctl(probe_socket.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return socket.inet_ntoa(answer[20:24])  # struct ifreq: the name's 16 bytes, then sockaddr_in's family, port


NCCL_SONAME = "libnccl.so.2"
_FULL_VERSION = re.compile(r"\.so\.(\d+)\.(\d+)\.(\d+)$")
_NCCL_WHEEL = re.compile(r"^nvidia_nccl_cu\d+-(\d+)\.(\d+)\.(\d+)[^/]*\.dist-info$")


def find_nccl(root: str, library_path: Iterable[str], python_paths: Iterable[str]) -> NcclLibrary | None:
    """The libnccl.so.2 that torch's workers will load, in ld.so's order for torch's DT_NEEDED entry
    (ld.so(8)): LD_LIBRARY_PATH (the user's with the site's directories), then torch's DT_RUNPATH,
    which in a pip install names the nvidia-nccl wheel's nvidia/nccl/lib in site-packages, then the
    loader's own directories, where an image's package (NGC's libnccl2) puts it. Its version from
    the real file's name (libnccl.so.2.27.3, as NCCL's packages install it), else from the wheel's
    dist-info directory (nvidia_nccl_cu12-2.27.3.dist-info); read without loading it, as the
    launcher never loads CUDA libraries."""
    wheels = [os.path.join(path, "nvidia", "nccl", "lib") for path in python_paths if path]
    for directory in (*library_path, *wheels, *loader_dirs(root)):
        candidate = under(root, os.path.join(directory, NCCL_SONAME))
        if not os.path.isfile(candidate):
            continue
        match = _FULL_VERSION.search(os.path.basename(os.path.realpath(candidate)))
        if match:
            return NcclLibrary(os.path.join(directory, NCCL_SONAME), tuple(int(part) for part in match.groups()))
        site_packages = os.path.normpath(os.path.join(os.path.dirname(candidate), "..", "..", ".."))  # nvidia/nccl/lib
        for name in sorted(os.listdir(site_packages)) if os.path.isdir(site_packages) else ():
            wheel = _NCCL_WHEEL.match(name)
            if wheel:
                return NcclLibrary(os.path.join(directory, NCCL_SONAME), tuple(int(part) for part in wheel.groups()))
        return NcclLibrary(os.path.join(directory, NCCL_SONAME), None)
    return None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def loader_dirs(root: str) -> tuple[str, ...]:
    """The directories dlopen searches without LD_LIBRARY_PATH: /etc/ld.so.conf.d's, then the trusted ones."""
    listed = []
    for name in list_dir(root, LD_SO_CONF_DIR) or ():
        if name.endswith(".conf"):
            text = read_text(root, f"{LD_SO_CONF_DIR}/{name}") or ""
            listed.extend(line.split("#")[0].strip() for line in text.splitlines())
    return tuple(d for d in listed if d.startswith("/")) + LOADER_DIRS


def probe_net_plugin(root: str, directories: Iterable[str], plugin_file: str) -> NetPlugin:
    def holds(directory: str) -> bool:
        return os.path.isfile(under(root, os.path.join(directory, plugin_file)))
    return NetPlugin(plugin_file, tuple(d for d in directories if holds(d)), any(holds(d) for d in loader_dirs(root)))


def first_file(root: str, directories: Iterable[str], name: str) -> str | None:
    """The first directory's name that is a file, as dlopen searches them (a container path), or None."""
    for directory in directories:
        path = os.path.join(directory, name)
        if os.path.isfile(under(root, path)):
            return path
    return None


def probe_libfabric_monitor(root: str, directories: Iterable[str]) -> str | None:
    """The default memory monitor of the libfabric.so.1 dlopen finds first in directories, then where the
    loader looks by itself (mr_monitor.default_monitor); None when none is found or it cannot be read.
    Read only where /dev/kdreg2 exists: the one place the answer changes the plan."""
    found = first_file(root, (*directories, *loader_dirs(root)), "libfabric.so.1")
    if found is None:
        return None
    real = os.path.realpath(under(root, found))
    try:
        with open(real, "rb") as handle:
            return mr_monitor.default_monitor(handle.read(), os.path.basename(real))
    except OSError:
        return None


def count_device_files(root: str, accelerator: Accelerator | None, dev: tuple[str, ...]) -> int:
    """The vendor's per-GPU device files (none when no vendor was asked about)."""
    if accelerator is None:
        return 0
    names = dev if accelerator.device_directory == "/dev" else list_dir(root, accelerator.device_directory) or ()
    return sum(1 for name in names if accelerator.is_device_file(name))


def _look_up(head: Head | None, resolve: Callable[[str], str | None] | None) -> Resolved | None:
    if head is None or resolve is None:
        return None
    return Resolved(head, resolve(head.name) if head.problem is None else None)


def look_up_peer(head: Resolved | None, peer: tuple[str, str] | None,
                  resolve: Callable[[str], str | None] | None) -> Resolved | None:
    """peer's lookup, only where the head's name answered loopback: on a Debian head node, whose own
    name /etc/hosts maps to 127.0.1.1, the route to another node tells which interface the others use."""
    if head is None or head.address is None or not is_loopback(head.address) or peer is None:
        return None
    return _look_up(Head.named(*peer), resolve)


def probe(root: str = "/", directories: Iterable[str] = (), head: Head | None = None,
          resolve: Callable[[str], str | None] | None = None,
          cuda: Callable[[], str | None] | None = None, files: Iterable[str] = (),
          plugin_dirs: Iterable[str] | None = None, loader: bool = False,
          accelerator: Accelerator | None = None, peer: tuple[str, str] | None = None,
          addresses: Callable[[str], str | None] | None = None, python_paths: Iterable[str] = ()) -> NodeFacts:
    """This node, read once. head is looked up with resolve (and peer, when head answers loopback);
    cuda() runs only when given.

    directories are looked for under root; files (the workload's script) as given, from the
    working directory, like the python command line will. On a Slingshot node, the NCCL net
    plugin is looked for in plugin_dirs and the loader's own directories, when plugin_dirs is given.
    accelerator: whose device files to count and whose net plugin to look for (None: no GPUs counted).
    loader: list the loader's trusted directories that exist (where the image's packages put their
    libraries; not ld.so.conf.d's, where CUDA's compat libcuda would overtake the driver's).
    On a Slingshot node with the kdreg2 module (/dev/kdreg2), the libfabric the workers load is read
    for its default memory monitor, in plugin_dirs' order and then the loader's.
    On a RoCE node, each interface's address is asked of addresses (interface_ipv4 on a node, None
    to ask nothing), and NCCL is looked for in plugin_dirs (the workers' LD_LIBRARY_PATH), then in
    python_paths' nvidia/nccl/lib, then in the loader's directories.
    """
    plugin_dirs = tuple(plugin_dirs) if plugin_dirs is not None else None
    dev = list_dir(root, "/dev") or ()
    cxi_devices = tuple(name for name in dev if name.startswith("cxi"))
    cxi_class = list_dir(root, "/sys/class/cxi") is not None
    kdreg2 = os.path.basename(mr_monitor.KDREG2_DEVICE) in dev
    looked_up = _look_up(head, resolve)
    rdma_devices = tuple(probe_rdma_device(root, name) for name in list_dir(root, "/sys/class/infiniband") or ())
    net_interfaces = list_dir(root, "/sys/class/net")
    roce = any(device.is_roce for device in rdma_devices)
    interface_addresses = {name: address for name in net_interfaces or ()
                           for address in [addresses(name) if roce and addresses is not None else None] if address}
    return NodeFacts(
        python=sys.executable,
        cpu_count=cpu_count(),
        machine=os.uname().machine,  # not the platform module: importing it costs ~1.5 ms per launch
        hostname=os.uname().nodename,
        gpu_device_files=count_device_files(root, accelerator, dev),
        cxi_devices=cxi_devices,
        cxi_class=cxi_class,
        rdma_devices=rdma_devices,
        net_interfaces=net_interfaces,
        routes=parse_routes(read_text(root, "/proc/net/route") or ""),
        existing_dirs=frozenset(d for d in directories if os.path.isdir(under(root, d))),
        existing_files=frozenset(f for f in files if os.path.isfile(f)),
        readable_files=frozenset(f for f in files if os.path.isfile(f) and os.access(f, os.R_OK)),
        cwd=os.getcwd(),
        head=looked_up,
        peer=look_up_peer(looked_up, peer, resolve),
        cuda_problem=cuda() if cuda is not None else None,
        net_plugin=(probe_net_plugin(root, plugin_dirs, accelerator.net_plugin)
                    if plugin_dirs is not None and accelerator is not None and (cxi_devices or cxi_class) else None),
        loader_dirs=tuple(d for d in LOADER_DIRS if os.path.isdir(under(root, d))) if loader else (),
        libfabric_monitor=(probe_libfabric_monitor(root, plugin_dirs)
                           if kdreg2 and plugin_dirs is not None and (cxi_devices or cxi_class) else None),
        interface_ipv4=interface_addresses,
        nccl=find_nccl(root, plugin_dirs or (), python_paths) if roce else None,
    )
