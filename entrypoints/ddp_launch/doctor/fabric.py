"""The fabric checks: the devices the site's fabric needs (/dev/cxi*, /sys/class/infiniband), the
NCCL settings the launcher would plan, and the fabric's libfabric provider (CXI) through fi_info."""

from __future__ import annotations

from typing import Tuple

from ddp_contract.place import in_a_pod
from ddp_launch.doctor.context import DoctorContext, fabric_expected, library_dirs
from ddp_launch.doctor.probes import is_executable_file
from ddp_launch.doctor.report import FAIL, OK, SKIP, WARN, Check
from ddp_launch.fabric.registry import registered
from ddp_launch.facts import under


def check_fabric_devices(ctx: DoctorContext) -> Check:
    expected = fabric_expected(ctx)
    cxi = list(ctx.facts.cxi_devices)
    rdma = [device.name for device in ctx.facts.rdma_devices]
    found = ", ".join(cxi + rdma) or "none"
    if expected is not None and not expected.detect(ctx.facts):
        status = FAIL if ctx.multi_node else WARN
        fix = expected.MISSING_FIX_IN_A_POD if in_a_pod(ctx.env) else expected.MISSING_FIX
        return Check("fabric devices", status, f"{expected.TITLE} expected but {expected.MISSING.format(found=found)}",
                     fix)
    return Check("fabric devices", OK, f"fabric {ctx.fabric.fabric}; devices: {found}")


def check_fabric_settings(ctx: DoctorContext) -> Check:
    env = ctx.env
    if "NCCL_NET" in env and "NCCL_NET_PLUGIN" in env:
        return Check("fabric settings", FAIL, f"NCCL_NET={env['NCCL_NET']} and NCCL_NET_PLUGIN={env['NCCL_NET_PLUGIN']} are both set",
                     "unset NCCL_NET_PLUGIN: with both, NCCL cannot find the network (CSCS docs PR #75)")
    roce = [finding for finding in ctx.fabric.findings if finding.topic == "roce" and finding.severity != "info"]
    if roce:
        # The RDMA device is there but no GID is this node's to give NCCL (fabric/infiniband.py).
        return Check("fabric settings", WARN, roce[0].text,
                     "see ibv_devinfo -v or /sys/class/infiniband/*/ports/1/gid_attrs/{types,ndevs}, and set "
                     "NCCL_IB_GID_INDEX to this node's IPv4 RoCE v2 GID")
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
    """The expected fabric's libfabric provider opens (fi_info -p cxi on Slingshot), where NCCL uses libfabric."""
    expected = fabric_expected(ctx)
    provider = expected.LIBFABRIC_PROVIDER if expected is not None else None
    if provider is None:
        through_libfabric = [fabric for fabric in registered() if fabric.LIBFABRIC_PROVIDER]
        return Check(f"fi_info -p {'/'.join(f.LIBFABRIC_PROVIDER for f in through_libfabric)}", SKIP,
                     f"no {' or '.join(f.TITLE for f in through_libfabric)} fabric expected")
    name = f"fi_info -p {provider}"
    candidates = fi_info_candidates(ctx)
    if not candidates:
        bound_bins = ", ".join(f"{s.target}/bin" for s in ctx.profile.binds) if ctx.profile else "no site profile"
        return Check(name, SKIP, f"fi_info neither in the bound directories ({bound_bins}) nor on PATH")
    library_path = ":".join(under(ctx.root, d) for d in library_dirs(ctx))
    # ld.so reads LD_LIBRARY_PATH only at start, so the bound libfabric reaches fi_info through env(1).
    argv = ["env", f"LD_LIBRARY_PATH={library_path}"] if library_path else []
    code, output = ctx.probes.run_command(argv + [candidates[0], "-p", provider])
    first = next((line.strip() for line in output.splitlines() if line.strip()), "")
    if code != 0:
        return Check(name, FAIL, f"exit {code}: {first}",
                     f"libfabric cannot open the {provider.upper()} provider: check the {provider} devices and the "
                     f"libfabric version")
    return Check(name, OK, first)
