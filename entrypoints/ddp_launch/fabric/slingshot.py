"""HPE Slingshot (CXI) with NCCL's AWS OFI plugin: detection and the converged defaults.

Values follow HPE's shs-ccl-docs ccl_env.sh (what Olivia's NCCL modules export)
and CSCS's nccl_env_vars; where they disagree the site profile decides.
"""

from __future__ import annotations

from typing import Optional, Tuple

from ddp_launch.fabric.common import EnvBuilder, list_dir

HPE = "HPE shs-ccl-docs ccl_env.sh (exported by Olivia's NCCL modules)"
CSCS = "CSCS nccl_env_vars"

# (name, value, source). NCCL_NET, NCCL_PROTO and NCCL_SOCKET_IFNAME depend on the
# job and are decided in slingshot_defaults below.
SLINGSHOT_TABLE: Tuple[Tuple[str, str, str], ...] = (
    ("NCCL_NET_GDR_LEVEL", "PHB", f"{HPE}; {CSCS}: GPUDirect RDMA up to the host bridge"),
    ("NCCL_CROSS_NIC", "1", f"{HPE}; {CSCS} (hpc-ai-envs uses 0)"),
    ("FI_CXI_DEFAULT_CQ_SIZE", "131072", f"{HPE}; {CSCS}: avoid CQ overflow at scale"),
    ("FI_CXI_DISABLE_HOST_REGISTER", "1", f"{HPE}; {CSCS}: avoid host-registration deadlocks with CUDA"),
    ("FI_MR_CACHE_MONITOR", "userfaultfd", f"{HPE}; {CSCS}: memory-registration cache monitor"),
    ("FI_CXI_RDZV_THRESHOLD", "0", f"{HPE}; {CSCS} workaround for NCCL hangs / watchdog timeouts"),
    ("FI_CXI_RDZV_GET_MIN", "0", f"{HPE}; {CSCS} workaround for NCCL hangs / watchdog timeouts"),
    ("FI_CXI_RDZV_EAGER_SIZE", "0", f"{HPE}; {CSCS} workaround for NCCL hangs / watchdog timeouts"),
    ("FI_PROVIDER", "cxi", "PyTorch on Olivia container script: use the CXI provider, never tcp/verbs"),
)

NCCL_NET_VALUE = "AWS Libfabric"
NCCL_NET_REASON = (
    f"{HPE}; {CSCS}: fail fast if the OFI plugin is missing instead of a silent TCP fallback "
    "(multi-node only: HPE warns it forces network transport on one node)"
)
LL128_REASON = "GH200: silent all-reduce corruption with LL128 (NVIDIA/nccl#2001); CSCS and Olivia disable it"


def slingshot_present(root: str) -> bool:
    cxi_devices = [d for d in (list_dir(root, "/dev") or ()) if d.startswith("cxi")]
    return bool(cxi_devices) or list_dir(root, "/sys/class/cxi") is not None


def hsn_interfaces(root: str) -> Optional[Tuple[str, ...]]:
    """hsn* network interfaces that exist, or None when /sys/class/net cannot be listed."""
    names = list_dir(root, "/sys/class/net")
    if names is None:
        return None
    return tuple(n for n in names if n.startswith("hsn"))


def check_socket_ifname(value: str, interfaces: Tuple[str, ...]) -> Optional[str]:
    """A message when NCCL_SOCKET_IFNAME cannot match any interface (NCCL fails cryptically, nccl#1837)."""
    if value.startswith("^"):
        return None
    exact = value.startswith("=")
    wanted = [w for w in value.lstrip("=").split(",") if w]
    matched = [w for w in wanted if any((i == w) if exact else i.startswith(w) for i in interfaces)]
    if matched:
        return None
    return f"NCCL_SOCKET_IFNAME={value} matches no interface on this node (have: {', '.join(interfaces) or 'none'})"


def slingshot_defaults(
    builder: EnvBuilder,
    root: str,
    multi_node: bool,
    gh200: bool,
    profile_ifname: Optional[str],
) -> None:
    env = builder.env
    if multi_node:
        if "NCCL_NET_PLUGIN" in env and "NCCL_NET" not in env:
            builder.notes.append(
                "NCCL_NET not set because you set NCCL_NET_PLUGIN; with both NCCL cannot find "
                "'AWS Libfabric' (CSCS docs PR #75). Unset NCCL_NET_PLUGIN to get the fail-fast check"
            )
        else:
            builder.default("NCCL_NET", NCCL_NET_VALUE, NCCL_NET_REASON)
    if "NCCL_NET_PLUGIN" in env and "NCCL_NET" in env:
        builder.notes.append("warning: NCCL_NET and NCCL_NET_PLUGIN are both set; NCCL then fails to find the network (unset NCCL_NET_PLUGIN)")
    if gh200:
        builder.default("NCCL_PROTO", "^LL128", LL128_REASON)
    for name, value, source in SLINGSHOT_TABLE:
        builder.default(name, value, source)
    interfaces = hsn_interfaces(root)
    if interfaces:
        builder.default(
            "NCCL_SOCKET_IFNAME", ",".join(interfaces),
            "the hsn* interfaces present in /sys/class/net (bootstrap on the Slingshot NICs, not the management network)",
        )
    elif interfaces is None and profile_ifname:
        builder.default("NCCL_SOCKET_IFNAME", profile_ifname, "site profile (could not list /sys/class/net)")
    elif interfaces is not None:
        builder.notes.append("warning: Slingshot expected but no hsn* interface exists; NCCL_SOCKET_IFNAME left unset")
    if interfaces and "NCCL_SOCKET_IFNAME" in env:
        problem = check_socket_ifname(env["NCCL_SOCKET_IFNAME"], interfaces)
        if problem:
            builder.notes.append(f"warning: {problem}")
