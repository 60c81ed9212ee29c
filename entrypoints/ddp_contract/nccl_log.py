"""Which network NCCL chose, read from its log after the first collective, and why it fell back to sockets.

On Slingshot a fallback from the OFI plugin to TCP sockets makes all-reduce ~20x slower and fails
nothing (CSCS: 1.09 ms vs 21.3 ms for 64 MiB on two GH200 nodes). The launcher sets DDP_EXPECT_FABRIC
and NCCL_DEBUG_FILE; the trainer calls check_nccl_transport(env) after its first collective. Here, in
the contract, because the trainer never imports the launcher: each fabric's causes of a fallback are
in SOCKETS_CAUSES by the fabric's name (ddp_contract.fabrics), and a fabric without its own gets the
NCCL log's lines to read. Standard library and Python 3.6 syntax, as the rest of the contract.
"""

import glob
import os
import re
import socket
from typing import Callable, Dict, Iterable, Mapping, NamedTuple, Optional, Tuple

from ddp_contract import EXPECT_FABRIC_VAR, REQUIRE_FABRIC_VAR

_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
_LOADED_PLUGIN = re.compile(r"NET/Plugin\s*:?\s*Loaded net plugin (?P<name>.+?)\s*(\(v\d+\))?\s*$")
_NO_PLUGIN = re.compile(r"NET/Plugin\s*:?\s*(No plugin found|Could not find|Plugin load returned|Failed to find|dlerror)", re.I)
_OFI_PROBLEM = re.compile(r"NET/OFI.*(Couldn't find|Unable to find|No provider|fi_getinfo|version|failed)", re.I)
_IB_PROBLEM = re.compile(r"NET/IB\s*:\s*(No device found|.*(failed|error|unable))", re.I)
_WARN = re.compile(r"NCCL WARN (?P<text>.*)$")

SOCKET_NAMES = ("Socket",)
SOCKET_FABRICS = ("ethernet",)   # sockets are the fabric: the check reports, never warns


class Transport(NamedTuple):  # NamedTuple, not a dataclass: Python 3.6 on login nodes
    network: Optional[str]            # "AWS Libfabric", "IB", "Socket", or None if not logged
    plugin: Optional[str]             # the net plugin NCCL loaded, if any
    plugin_problem: Optional[str]     # NCCL's line saying the plugin was not found
    ofi_problem: Optional[str]        # an OFI/libfabric error line (e.g. version mismatch)
    warnings: Tuple[str, ...]         # NCCL WARN lines
    ib_problem: Optional[str]         # NCCL's IB verbs transport line saying it found or opened nothing

    @property
    def is_socket(self) -> bool:
        return self.network in SOCKET_NAMES


def detect_nccl_transport(lines: Iterable[str]) -> Transport:
    network = plugin = plugin_problem = ofi_problem = ib_problem = None
    warnings = []
    for raw in lines:
        line = raw.rstrip("\n")
        match = _USING_NETWORK.search(line)
        if match:
            network = match.group("name")
        match = _LOADED_PLUGIN.search(line)
        if match:
            plugin = match.group("name")
        if plugin_problem is None and _NO_PLUGIN.search(line):
            plugin_problem = line.split("NCCL INFO", 1)[-1].strip()
        if ofi_problem is None and _OFI_PROBLEM.search(line):
            ofi_problem = line.split("NCCL ", 1)[-1].strip()
        if ib_problem is None and _IB_PROBLEM.search(line):
            ib_problem = line.split("NCCL ", 1)[-1].strip()
        match = _WARN.search(line)
        if match:
            warnings.append(match.group("text").strip())
    return Transport(network, plugin, plugin_problem, ofi_problem, tuple(warnings), ib_problem)


def _infiniband_cause(transport: Transport, env: Mapping[str, str]) -> str:
    """InfiniBand and RoCE go through NCCL's built-in IB verbs transport, no plugin: NCCL logs
    "NET/Plugin: No plugin found" on every such node, so that line is no cause here."""
    if env.get("NCCL_IB_DISABLE", "").strip() == "1":
        return "NCCL_IB_DISABLE=1 turns NCCL's IB/RoCE transport off; unset it"
    if transport.ib_problem and "no device" in transport.ib_problem.lower():
        return (f"NCCL found no RDMA device in the container ({transport.ib_problem}); on RunAI/Kubernetes "
                "request one (--extended-resource rdma/rdma=1 and the kube-system/roce network annotation), "
                "under Apptainer check /dev/infiniband on the node (ddp-launch doctor)")
    if transport.ib_problem:
        return (f"NCCL's IB transport did not start ({transport.ib_problem}); check NCCL_IB_HCA and "
                "NCCL_IB_GID_INDEX against /sys/class/infiniband (ddp-launch doctor)")
    return "see the NET/IB lines of the NCCL log; NCCL_IB_HCA and NCCL_IB_GID_INDEX must name a live port (ddp-launch doctor)"


def _slingshot_cause(transport: Transport, env: Mapping[str, str]) -> str:
    """Slingshot is reached only through the aws-ofi-nccl plugin and the host's libfabric."""
    if transport.ofi_problem:
        return f"libfabric/OFI error ({transport.ofi_problem}); often a libfabric version the plugin was not built for - rebind the matching module (ddp-launch binds)"
    if transport.plugin_problem or transport.plugin is None:
        return "the NCCL net plugin (libnccl-net.so) was not found; check LD_LIBRARY_PATH includes the bound aws-ofi-nccl lib dir (ddp-launch doctor)"
    if "NCCL_NET" not in env:
        return "NCCL_NET is unset, so NCCL fell back silently; set NCCL_NET='AWS Libfabric' to fail fast"
    return "see the NCCL log for the reason"


# Each fabric's reading of a sockets fallback, by its name; a fabric not listed gets UNLISTED_CAUSE.
SOCKETS_CAUSES: Dict[str, Callable[[Transport, Mapping[str, str]], str]] = {
    "slingshot": _slingshot_cause,
    "infiniband": _infiniband_cause,
}
UNLISTED_CAUSE = "see the NET/ lines of the NCCL log for why NCCL chose sockets; ddp-launch doctor checks the fabric"


def likely_cause(transport: Transport, env: Mapping[str, str], expected: str = "slingshot") -> str:
    """Why NCCL fell back to sockets, for the fabric that was expected: each has its own causes."""
    cause = SOCKETS_CAUSES.get(expected)
    return cause(transport, env) if cause else UNLISTED_CAUSE


def sockets_warning(transport: Transport, expected: str, env: Mapping[str, str]) -> Optional[str]:
    """A loud message when a fabric was expected but NCCL uses TCP sockets; None when fine."""
    if not transport.is_socket or expected in SOCKET_FABRICS:
        return None
    return (
        f"WARNING: NCCL is using TCP sockets although {expected} is expected: "
        f"all-reduce will be ~20x slower. Cause: {likely_cause(transport, env, expected)}."
    )


def nccl_log_paths(pattern: str, hostname: Optional[str] = None, pid: Optional[int] = None) -> Tuple[str, ...]:
    """NCCL_DEBUG_FILE with %h and %p filled in as NCCL does (short or full hostname)."""
    host = hostname or socket.gethostname()
    process = str(os.getpid() if pid is None else pid)
    names = []
    for candidate in (host.split(".")[0], host):
        path = pattern.replace("%h", candidate).replace("%p", process)
        if path not in names:
            names.append(path)
    return tuple(names)


def read_log(paths: Iterable[str]) -> Optional[Tuple[str, ...]]:
    for path in paths:
        for match in sorted(glob.glob(glob.escape(path))):
            try:
                with open(match, encoding="utf-8", errors="replace") as handle:
                    return tuple(handle)
            except OSError:
                continue
    return None


def check_nccl_transport(
    env: Mapping[str, str], hostname: Optional[str] = None, pid: Optional[int] = None
) -> Tuple[bool, str]:
    """(ok, message) for this process after its first NCCL collective.

    ok is False only when sockets were chosen and DDP_REQUIRE_FABRIC=1; a
    sockets fallback without it is ok=True with the loud warning as message.
    """
    expected = env.get(EXPECT_FABRIC_VAR)
    if not expected:
        return True, "no high-speed fabric expected; NCCL transport not checked"
    required = env.get(REQUIRE_FABRIC_VAR) == "1"
    pattern = env.get("NCCL_DEBUG_FILE")
    lines = read_log(nccl_log_paths(pattern, hostname, pid)) if pattern else None
    if lines is None:
        return True, (
            f"cannot tell which network NCCL chose ({expected} expected): no NCCL log "
            f"(NCCL_DEBUG_FILE={pattern or 'unset'}, NCCL_DEBUG={env.get('NCCL_DEBUG', 'unset')}); "
            "set NCCL_DEBUG=INFO to check"
        )
    transport = detect_nccl_transport(lines)
    warning = sockets_warning(transport, expected, env)
    if warning:
        if required:
            return False, warning.replace("WARNING:", "error (--require-fabric):", 1)
        return True, warning
    if transport.network is None:
        return True, f"NCCL has not logged its network choice yet ({expected} expected)"
    via = f" via plugin {transport.plugin}" if transport.plugin else ""
    return True, f"NCCL network: {transport.network}{via} ({expected} expected)"
