"""The library checks: each host library the expected fabric lists (Slingshot's: libfabric, libcxi, the
collective's OFI net plugin) found where ld.so looks and loaded, and every bound host library's
dependencies met."""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Sequence, Tuple

from ddp_launch.doctor.context import DoctorContext, container_runtime, fabric_expected, library_dirs
from ddp_launch.doctor.probes import distinct_files, find_files, shared_objects
from ddp_launch.doctor.report import FAIL, OK, SKIP, WARN, Check
from ddp_launch.fabric.defaults import FabricDefaults, HostLibrary, for_accelerator
from ddp_launch.fabric.registry import registered
from ddp_launch.facts import under
from ddp_launch.libclosure import ld_so_conf_dirs, node_default_dirs
from ddp_launch.libload import missing_library
from ddp_launch.sites import container_search_paths

# NCCL dlopens libnccl-net.so unless NCCL_NET_PLUGIN=ofi names the -ofi variant.
OFI_PLUGIN_LABEL = "OFI plugin"
# The order ddp_launch.binds puts the site's library directories on LD_LIBRARY_PATH.
BIND_GROUPS = ("first", "prepend", "append")


def _loader_dirs(ctx: DoctorContext) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """Where ld.so looks for a library dlopened by name, in its order (ld.so(8)): the workers'
    LD_LIBRARY_PATH, then /etc/ld.so.cache, then the default directories; each with its label.

    Apptainer does not pass the host's LD_LIBRARY_PATH in (user guide, "Environment and
    Metadata": it is reset to /.singularity.d/libs), and images install the fabric's libraries
    where ld.so.conf lists them: LUMI AI Factory's keep libfabric and libcxi in
    /usr/lib/x86_64-linux-gnu and run ldconfig (lumi-ai-factory/laifs-container-recipes,
    containerfiles/libfabric/Ubuntu_Rocm_Slingshot). The cache stands here as the directories
    ldconfig builds it from, /etc/ld.so.conf and its includes (ldconfig(8)): they read from a
    probe root as a test's tree, where the binary cache would need a real ldconfig run.
    """
    return (("LD_LIBRARY_PATH", library_dirs(ctx)),
            ("/etc/ld.so.conf", ld_so_conf_dirs(ctx.root)),
            ("the default directories", node_default_dirs(ctx.facts.machine)))


def _search_order(groups: Sequence[Tuple[str, Tuple[str, ...]]]) -> Tuple[str, ...]:
    ordered: list = []
    for _, dirs in groups:
        ordered.extend(d for d in dirs if d not in ordered)
    return tuple(ordered)


def loaded_first(ctx: DoctorContext, file_pattern: str) -> Optional[str]:
    """The container path of the file (a regular expression on its name) that ld.so finds first for
    the workers, or None: what dlopen of that name loads (ld.so(8), _loader_dirs)."""
    hits = distinct_files(ctx.root, find_files(ctx.root, _search_order(_loader_dirs(ctx)), file_pattern))
    return hits[0] if hits else None


def _not_found(groups: Sequence[Tuple[str, Tuple[str, ...]]]) -> str:
    return "not found where ld.so looks: " + "; ".join(
        f"{label} ({':'.join(dirs) or 'empty'})" for label, dirs in groups)


def _load_failure(path: str, error: str) -> str:
    missing = missing_library(path, error)
    return f"{missing} is missing (needed to load {os.path.basename(path)})" if missing else error


def host_libraries(ctx: DoctorContext, fabric: str) -> Tuple[HostLibrary, ...]:
    """The fabric's host libraries, in load order (containers/sites/fabrics/<fabric>.json: Slingshot's),
    with the vendor's collective library and net plugin named."""
    return tuple(for_accelerator(library, ctx.accelerator)
                 for library in ctx.data.fabric_defaults(fabric).host_libraries)


def _with_host_libraries(ctx: DoctorContext) -> Tuple[str, ...]:
    """The fabrics whose data lists host libraries, as messages name them (Slingshot)."""
    return tuple(fabric.TITLE for fabric in registered()
                 if isinstance(ctx.data.defaults.get(fabric.NAME), FabricDefaults)
                 and ctx.data.defaults[fabric.NAME].host_libraries)


def bind_variable(runtime: str) -> str:
    """Where each runtime reads its binds: APPTAINER_BIND, SINGULARITY_BIND (their user guides,
    "Bind Paths and Mounts")."""
    return f"{runtime.upper()}_BIND"


def binds_fix(ctx: DoctorContext) -> Optional[str]:
    """The command that binds the host's fabric libraries, when nothing was bound (APPTAINER_BIND unset).

    Host paths enter the container only through binds (Apptainer user guide, "Bind Paths
    and Mounts"), and Apptainer sets APPTAINER_BIND inside the container to what was bound
    (user guide appendix, "Apptainer's environment variables"): unset here means none was.
    It is read on the host, so the container must be started again, and by the site's runtime:
    SingularityCE (LUMI) reads SINGULARITY_BIND.
    """
    if ctx.env.get("APPTAINER_BIND") or ctx.env.get("SINGULARITY_BIND"):
        return None
    site = ctx.profile.name if ctx.profile else "SITE"
    variable = bind_variable(container_runtime(ctx))
    return (f'nothing is bound ({variable} is unset): on the host run '
            f'export {variable}="$(python3 -m ddp_launch.binds --site {site})" '
            f'(PYTHONPATH=<checkout>/entrypoints), then start the container again')


def check_host_libraries(ctx: DoctorContext) -> Tuple[Check, ...]:
    expected = fabric_expected(ctx)
    libraries = host_libraries(ctx, expected.NAME) if expected is not None and expected.HAS_DEFAULTS else ()
    if not libraries:
        titles = " or ".join(_with_host_libraries(ctx)) or "host-library"
        return (Check("host libraries", SKIP, f"no {titles} fabric expected; the image's own NCCL is used"),)
    groups = _loader_dirs(ctx)
    dirs = _search_order(groups)
    checks = []
    vendor = ctx.accelerator
    plugin, ofi_variant = vendor.net_plugin, vendor.net_plugin.replace(".so", "-ofi.so")
    for library in libraries:
        label = library.label
        hits = distinct_files(ctx.root, find_files(ctx.root, dirs, library.file))
        if not hits and label == OFI_PLUGIN_LABEL and find_files(ctx.root, dirs, re.escape(ofi_variant)):
            checks.append(Check(label, WARN, f"only {ofi_variant} found; {vendor.collective} dlopens {plugin} unless NCCL_NET_PLUGIN=ofi",
                                f"bind a plugin directory that has {plugin} (the {vendor.ofi_plugin} module provides the link)"))
            continue
        if not hits:
            # On a node of the fabric, or in a multi-node job, training across nodes cannot work without
            # it; elsewhere (a login node without CXI, the image's %test) it is not fatal yet.
            status = FAIL if library.required and (ctx.multi_node or expected.detect(ctx.facts)) else WARN
            checks.append(Check(label, status, _not_found(groups), binds_fix(ctx) or library.fix))
            continue
        chosen = hits[0]
        shadowed = f"; also {', '.join(hits[1:])} (later in ld.so's search, not used)" if len(hits) > 1 else ""
        try:
            version = ctx.probes.load_library(under(ctx.root, chosen), library.kind)
        except OSError as exc:
            checks.append(Check(label, FAIL, f"{chosen} does not load: {_load_failure(chosen, str(exc))}", library.fix))
            continue
        checks.append(Check(label, OK, f"{chosen} loads{(' (' + version + ')') if version else ''}{shadowed}"))
    if vendor.plugin_dlopens is None:
        return tuple(checks)
    runtime = vendor.plugin_dlopens
    if find_files(ctx.root, dirs + vendor.plugin_dlopens_dirs, re.escape(runtime)):
        checks.append(Check(runtime, OK, f"unversioned {runtime} present (the dynamically linked plugin needs it)"))
    else:
        checks.append(Check(runtime, WARN, f"no unversioned {runtime} on the library path",
                            "the cuda-dl OFI plugin dlopens libcudart.so (aws-ofi-nccl#244); symlink it to libcudart.so.12"))
    return tuple(checks)


def _bound_libraries(ctx: DoctorContext) -> Tuple[Tuple[str, str], ...]:
    """(container path, LD_LIBRARY_PATH group) of each shared object in the site's library dirs."""
    if ctx.profile is None:
        return ()
    groups = container_search_paths(ctx.profile)
    return shared_objects(ctx.root, tuple((group, groups[group]) for group in BIND_GROUPS))


def check_library_dependencies(ctx: DoctorContext) -> Check:
    """Every bound host library loads with the workers' LD_LIBRARY_PATH, or the missing one is named.

    A dependency that `ddp-launch binds` could not bind (or binds from an old checkout
    did not) shows here as glibc's "libX.so.N: cannot open shared object file".
    """
    name = "library dependencies"
    bound = _bound_libraries(ctx)
    if not bound:
        return Check(name, SKIP, "no bound host libraries in this container")
    library_path = ":".join(under(ctx.root, d) for d in library_dirs(ctx))
    results = ctx.probes.load_in_child([under(ctx.root, path) for path, _ in bound], library_path)
    failures = [(path, group, error) for (path, group), (_, error) in zip(bound, results) if error]
    if not failures:
        return Check(name, OK, f"{len(bound)} bound libraries load with the planned LD_LIBRARY_PATH")
    needers: Dict[str, list] = {}
    for path, _, error in failures:
        needers.setdefault(missing_library(under(ctx.root, path), error) or "", []).append(os.path.basename(path))
    parts = [f"{missing} is missing (needed to load {', '.join(names)})" for missing, names in needers.items() if missing]
    parts += [f"{os.path.basename(path)}: {error}" for path, _, error in failures
              if not missing_library(under(ctx.root, path), error)]
    # The NCCL network path (first/prepend) must load; extras appended for convenience only warn.
    critical = any(group != "append" for _, group, _ in failures)
    status = FAIL if critical and ctx.multi_node else WARN
    return Check(name, status, "; ".join(parts),
                 f"run `ddp-launch binds --site {ctx.profile.name}` on the host again: it binds the host libraries "
                 f"these need (its stderr names each, and warns about those the host lacks too)")
