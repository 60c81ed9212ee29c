"""The fabric checks: the devices the site's fabric needs (/dev/cxi*, /sys/class/infiniband), the
NCCL settings the launcher would plan, and libfabric's CXI provider through fi_info."""

from __future__ import annotations

from typing import Tuple

from ddp_contract.place import in_a_pod
from ddp_launch.doctor.context import DoctorContext, fabric_expected, library_dirs
from ddp_launch.doctor.probes import is_executable_file
from ddp_launch.doctor.report import FAIL, OK, SKIP, WARN, Check
from ddp_launch.facts import under


def check_fabric_devices(ctx: DoctorContext) -> Check:
    expected = fabric_expected(ctx)
    cxi = list(ctx.facts.cxi_devices)
    rdma = [device.name for device in ctx.facts.rdma_devices]
    found = ", ".join(cxi + rdma) or "none"
    if expected == "slingshot" and not ctx.facts.slingshot_present:
        status = FAIL if ctx.multi_node else WARN
        return Check("fabric devices", status, f"Slingshot expected but no /dev/cxi* (found: {found})",
                     "run on a compute node; inside Apptainer /dev is shared, so check the node itself")
    if expected == "infiniband" and not rdma:
        status = FAIL if ctx.multi_node else WARN
        fix = ("on RunAI add --extended-resource rdma/rdma=1 and the roce network annotation (runai/submit.sh adds "
               "them by default), or set NCCL_IB_DISABLE=1 in the pods to train without RoCE (runai/submit.sh does "
               "when asked for no RDMA)" if in_a_pod(ctx.env)
               else "run on a node with an InfiniBand HCA (check the job's partition), or set NCCL_IB_DISABLE=1 "
                    "to train over Ethernet sockets")
        return Check("fabric devices", status, "InfiniBand/RoCE expected but /sys/class/infiniband is empty", fix)
    return Check("fabric devices", OK, f"fabric {ctx.fabric.fabric}; devices: {found}")


def check_fabric_settings(ctx: DoctorContext) -> Check:
    env = ctx.env
    if "NCCL_NET" in env and "NCCL_NET_PLUGIN" in env:
        return Check("fabric settings", FAIL, f"NCCL_NET={env['NCCL_NET']} and NCCL_NET_PLUGIN={env['NCCL_NET_PLUGIN']} are both set",
                     "unset NCCL_NET_PLUGIN: with both, NCCL cannot find the network (CSCS docs PR #75)")
    kept = [finding for finding in ctx.fabric.findings if finding.topic == "kept"]
    detail = f"{len(ctx.fabric.changes)} variables from the {ctx.fabric.fabric} defaults"
    if kept:
        detail += f"; {len(kept)} of yours kept (see ddp-launch --dry-run)"
    return Check("fabric settings", OK, detail)


def fi_info_candidates(ctx: DoctorContext) -> Tuple[str, ...]:
    """Where the binds put fi_info (<target>/bin of each bound directory, from the site profile), then PATH."""
    found = []
    for spec in ctx.profile.binds if ctx.profile else ():
        candidate = under(ctx.root, f"{spec.target.rstrip('/')}/bin/fi_info")
        if is_executable_file(candidate):
            found.append(candidate)
    on_path = ctx.probes.which("fi_info")
    if on_path:
        found.append(on_path)
    return tuple(found)


def check_fi_info(ctx: DoctorContext) -> Check:
    if fabric_expected(ctx) != "slingshot":
        return Check("fi_info -p cxi", SKIP, "no Slingshot fabric expected")
    candidates = fi_info_candidates(ctx)
    if not candidates:
        bound_bins = ", ".join(f"{s.target}/bin" for s in ctx.profile.binds) if ctx.profile else "no site profile"
        return Check("fi_info -p cxi", SKIP, f"fi_info neither in the bound directories ({bound_bins}) nor on PATH")
    library_path = ":".join(under(ctx.root, d) for d in library_dirs(ctx))
    # ld.so reads LD_LIBRARY_PATH only at start, so the bound libfabric reaches fi_info through env(1).
    argv = ["env", f"LD_LIBRARY_PATH={library_path}"] if library_path else []
    code, output = ctx.probes.run_command(argv + [candidates[0], "-p", "cxi"])
    first = next((line.strip() for line in output.splitlines() if line.strip()), "")
    if code != 0:
        return Check("fi_info -p cxi", FAIL, f"exit {code}: {first}", "libfabric cannot open the CXI provider: check the cxi devices and the libfabric version")
    return Check("fi_info -p cxi", OK, first)
