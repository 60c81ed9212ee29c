"""The checks `ddp-launch doctor` runs: each reads a DoctorContext and returns one Check.

Probes that touch the real machine (torch import, dlopen, fi_info, the GPU health tool, TCP
connect) come in through Probes so tests can drive every branch with fake /sys, /dev trees.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import socket
import subprocess
from dataclasses import dataclass, replace
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from ddp_contract import DATASET_DIRNAME, missing_dataset_files
from ddp_launch import gpu_health, planner
from ddp_launch.accelerators import DEFAULT_ACCELERATOR, Accelerator, load_accelerator
from ddp_launch.envvars import Setting, integer
from ddp_launch.errors import LaunchError
from ddp_launch.fabric import FabricPlan, FabricRequest, directories_to_probe, plan_fabric
from ddp_launch.fabric.defaults import (FabricData, HostLibrary, for_accelerator, load_fabric_defaults,
                                        read_all_fabric_defaults)
from ddp_launch.fabric.slingshot import check_socket_ifname
from ddp_launch.facts import NodeFacts, list_dir, read_text, under
from ddp_launch.gpus import COUNT_GRANT_VARIABLES, granted_gpus
from ddp_launch.libclosure import ld_so_conf_dirs, node_default_dirs
from ddp_launch.libload import load_in_child, missing_library
from ddp_launch.options import read_options
from ddp_launch.plan import LAUNCHER, LaunchPlan
from ddp_launch.rendezvous import host_name_problem
from ddp_launch.sites import CONTAINER_RUNTIMES, SiteProfile, container_search_paths

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"
# Set by the job scripts (slurm/lib/ddp.sh): the command that runs the image, apptainer or singularity.
CONTAINER_RUNTIME_VAR = "DDP_CONTAINER_RUNTIME"
# Oldest Linux driver for each CUDA major (CUDA toolkit release notes, table 3), by runtime:
# no such table is published for HIP (the amdgpu driver ships with each ROCm release).
MIN_DRIVER_FOR_CUDA = {11: 450, 12: 525, 13: 580}
MIN_DRIVER = {"CUDA": MIN_DRIVER_FOR_CUDA}
# NCCL dlopens libnccl-net.so unless NCCL_NET_PLUGIN=ofi names the -ofi variant.
OFI_PLUGIN_LABEL = "OFI plugin"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def real_filesystem_bytes(path: str) -> Optional[int]:
    """The size of the filesystem at path (statvfs), or None when it cannot be read."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


# nvidia-smi -q on an 8-GPU node takes seconds; one that hangs is itself a sick node.
HEALTH_TIMEOUT_S = 120


def real_read_command(argv: Sequence[str]) -> Tuple[int, str, str]:
    """(exit status, stdout, stderr); 127 when it cannot start, 124 when it runs past HEALTH_TIMEOUT_S."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=HEALTH_TIMEOUT_S, check=False)
    except OSError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer within {HEALTH_TIMEOUT_S} s"
    return done.returncode, done.stdout, done.stderr


@dataclass(frozen=True)
class Probes:
    torch_info: Callable[[], Optional[Dict[str, object]]]
    load_library: Callable[[str, str], str]            # (path, kind) -> version text; raises OSError
    run_command: Callable[[Sequence[str]], Tuple[int, str]]
    connect: Callable[[str, int, float], str]           # "open" | "refused" | "timeout" | "error: ..."
    which: Callable[[str], Optional[str]] = shutil.which
    # (paths, LD_LIBRARY_PATH) -> ((path, dlopen error or ""), ...), in a fresh process
    load_in_child: Callable[[Sequence[str], str], Tuple[Tuple[str, str], ...]] = load_in_child
    filesystem_bytes: Callable[[str], Optional[int]] = real_filesystem_bytes
    read_command: Callable[[Sequence[str]], Tuple[int, str, str]] = real_read_command  # the GPU health tool


@dataclass(frozen=True)
class DoctorContext:
    env: Mapping[str, str]
    root: str
    offline: bool
    profile: Optional[SiteProfile]
    data_dir: str
    probes: Probes
    facts: NodeFacts                    # this node, read once by the launcher's own probe
    fabric: FabricPlan                  # what the launcher would set on this node, from the same code
    accelerator: Accelerator            # the site's GPU vendor (its device files, flag, driver, collective)
    launch: Optional[LaunchPlan] = None     # the launcher's plan; None when planning refused
    plan_problem: Optional[str] = None      # the launcher's one-line refusal, when it refused
    cpu_workers: Optional[Setting] = None   # CPU workers asked for (DDP_LAUNCH_CPU_WORKERS): GPUs unused on purpose

    @property
    def multi_node(self) -> bool:
        return self.launch is not None and self.launch.nodes > 1


def launcher_argv(profile: Optional[SiteProfile]) -> Tuple[str, ...]:
    """What the doctor asks the planner: a dry run (no waiting for a pod's DNS) with the site."""
    return ("--dry-run",) + (("--site", profile.name) if profile else ())


def make_context(env, root, offline, profile, data_dir, probes) -> DoctorContext:
    """Probe and plan as `ddp-launch` would here; a refusal becomes ctx.plan_problem, not a crash."""
    argv = launcher_argv(profile)
    accelerator = load_accelerator(profile.accelerator if profile else DEFAULT_ACCELERATOR, env)
    data = FabricData(profile, read_all_fabric_defaults(env), accelerator)
    launch, problem, cpu_workers = None, None, None
    try:
        options = read_options(argv, env)
        cpu_workers = options.cpu_workers
        parsed = planner.parse(options, env, data)
        # Without the driver question: check_gpus asks torch itself and says more than a refusal.
        questions = replace(planner.questions(parsed), cuda=False)
    except LaunchError as error:
        questions = planner.ProbeQuestions(directories=directories_to_probe(data), accelerator=accelerator)
        problem = str(error)
    facts = planner.probe(questions, root)
    if problem is None:
        try:
            launch = planner.plan(parsed, facts)
        except LaunchError as error:
            problem = str(error)
    if launch is not None and launch.fabric is not None:
        fabric = FabricPlan(launch.fabric, tuple(c for c in launch.changes if c.origin != LAUNCHER), launch.findings)
    else:
        # The planner refused before the fabric: the node's own fabric settings still get checked.
        fabric = plan_fabric(FabricRequest(env=env, multi_node=False), facts, data)
    return DoctorContext(env, root, offline, profile, data_dir, probes, facts, fabric, accelerator, launch, problem,
                         cpu_workers)


def fabric_expected(ctx: DoctorContext) -> Optional[str]:
    if ctx.profile and ctx.profile.fabric in ("slingshot", "infiniband"):
        return ctx.profile.fabric
    return ctx.fabric.fabric if ctx.fabric.fabric != "ethernet" else None


def container_runtime(ctx: DoctorContext) -> str:
    """The command the fixes name: DDP_CONTAINER_RUNTIME where the job script set it (slurm/lib/ddp.sh
    runs the image with it, and Apptainer and SingularityCE pass the host's environment in), else the
    site profile's (LUMI: singularity, its only runtime), else apptainer."""
    chosen = ctx.env.get(CONTAINER_RUNTIME_VAR, "")
    if chosen in CONTAINER_RUNTIMES:
        return chosen
    return ctx.profile.container_runtime if ctx.profile else CONTAINER_RUNTIMES[0]


def bind_variable(runtime: str) -> str:
    """Where each runtime reads its binds: APPTAINER_BIND, SINGULARITY_BIND (their user guides,
    "Bind Paths and Mounts")."""
    return f"{runtime.upper()}_BIND"


def planned(ctx: DoctorContext, name: str) -> Optional[str]:
    """The value the launcher would run with: the user's, else the fabric plan's."""
    if name in ctx.env:
        return ctx.env[name]
    for change in ctx.fabric.changes:
        if change.name == name:
            return change.value
    return None


# --- checks ---------------------------------------------------------------

def check_gpus(ctx: DoctorContext) -> Check:
    info = ctx.probes.torch_info() or {}
    vendor = ctx.accelerator
    visible = info.get("cuda_device_count")
    source = "torch.cuda.device_count()"  # ROCm builds of torch answer through torch.cuda too
    if not isinstance(visible, int):
        visible, source = ctx.facts.gpu_device_files, vendor.device_label
    # The message names the variable the count came from: a RunAI pod has no SLURM_GPUS_ON_NODE.
    granted_from = next((name for name in COUNT_GRANT_VARIABLES if ctx.env.get(name)), None)
    try:
        granted = integer(granted_from, ctx.env[granted_from]) if granted_from else None
    except LaunchError as error:
        return Check("gpus", FAIL, str(error), f"give {granted_from} a whole number of GPUs")
    runtime = container_runtime(ctx)
    if granted and visible == 0 and ctx.cpu_workers is not None:
        # The launcher takes --cpu-workers as training on CPU on purpose and leaves the granted GPUs
        # alone (gpus.grant_to_check): the preflight must not fail every node for what it accepts.
        return Check("gpus", WARN, f"0 GPUs visible ({source}), {granted} granted; the workers run on CPU as "
                                   f"{ctx.cpu_workers.source}={ctx.cpu_workers.value} asks",
                     f"to train on the GPUs, unset {ctx.cpu_workers.source} and run with `{runtime} exec "
                     f"{vendor.apptainer_flag}` (or `{runtime} run {vendor.apptainer_flag}`)")
    if granted and visible == 0:
        return Check("gpus", FAIL, f"0 GPUs visible ({source}) but {granted} granted",
                     f"run with `{runtime} exec {vendor.apptainer_flag}` (or `{runtime} run {vendor.apptainer_flag}`) "
                     "so the GPUs enter the container")
    if granted is not None and visible != granted:
        return Check("gpus", WARN, f"{visible} GPUs visible ({source}), {granted} granted",
                     f"check {vendor.visible_variables[0]} and the job's --gpus-per-node")
    if visible == 0:
        return Check("gpus", WARN, "no GPUs visible; training will run on CPU",
                     f"on a GPU node, add {vendor.apptainer_flag} to {runtime}")
    granted_note = f", {granted} granted" if granted is not None else ""
    return Check("gpus", OK, f"{visible} GPUs visible ({source}){granted_note}")


def check_gpu_health(ctx: DoctorContext) -> Check:
    """The GPUs' health counters by the vendor's rules (containers/sites/accelerators/<vendor>.json)."""
    health = ctx.accelerator.health
    grant = granted_gpus(ctx.env, ctx.accelerator)
    found = ctx.probes.which(health.commands[0].argv[0]) is not None
    outputs = [gpu_health.CommandOutput(command.argv, *ctx.probes.read_command(command.argv))
               for command in (health.commands if found else ())]
    verdict = gpu_health.assess(ctx.accelerator, grant, found, outputs, container_runtime(ctx))
    return Check(gpu_health.NAME, verdict.status, verdict.detail, verdict.fix)


def check_torch(ctx: DoctorContext) -> Check:
    info = ctx.probes.torch_info()
    if info is None:
        return Check("torch", FAIL, "torch cannot be imported", "use an image with PyTorch (the NGC base) or pip install torch")
    parts = [f"torch {info.get('version')}"]
    if info.get("cuda"):
        parts.append(f"CUDA {info['cuda']}")
    if info.get("hip"):
        parts.append(f"HIP {info['hip']}")
    if info.get("nccl"):
        parts.append(f"{ctx.accelerator.collective} {info['nccl']}")
    return Check("torch", OK, ", ".join(parts))


def check_launch_plan(ctx: DoctorContext) -> Check:
    """What `ddp-launch` would do here, from the same planner; its refusal is the finding."""
    if ctx.launch is None:
        return Check("launch plan", FAIL, ctx.plan_problem or "no plan",
                     "fix what the message names; `ddp-launch --dry-run` shows the same")
    where = ""
    if ctx.launch.rendezvous is not None:
        port = ctx.launch.rendezvous.port
        where = f", rendezvous {ctx.launch.rendezvous.host}" + (f":{port}" if port is not None else "")
    return Check("launch plan", OK, f"{ctx.launch.mode} on {ctx.launch.nodes} node(s){where}")


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
        return Check("fabric devices", status, "InfiniBand/RoCE expected but /sys/class/infiniband is empty",
                     "on RunAI add --extended-resource rdma/rdma=1 and the roce network annotation")
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


def _library_dirs(ctx: DoctorContext) -> Tuple[str, ...]:
    """The workers' LD_LIBRARY_PATH: the launcher merges the site's directories into the
    user's (NGC images set one), so its planned change wins over the environment's value."""
    merged = next((c.value for c in ctx.fabric.changes if c.name == "LD_LIBRARY_PATH"), None)
    value = merged if merged is not None else ctx.env.get("LD_LIBRARY_PATH", "")
    return tuple(d for d in value.split(":") if d)


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
    return (("LD_LIBRARY_PATH", _library_dirs(ctx)),
            ("/etc/ld.so.conf", ld_so_conf_dirs(ctx.root)),
            ("the default directories", node_default_dirs(ctx.facts.machine)))


def _search_order(groups: Sequence[Tuple[str, Tuple[str, ...]]]) -> Tuple[str, ...]:
    ordered: list = []
    for _, dirs in groups:
        ordered.extend(d for d in dirs if d not in ordered)
    return tuple(ordered)


def _not_found(groups: Sequence[Tuple[str, Tuple[str, ...]]]) -> str:
    return "not found where ld.so looks: " + "; ".join(
        f"{label} ({':'.join(dirs) or 'empty'})" for label, dirs in groups)


def _load_failure(path: str, error: str) -> str:
    missing = missing_library(path, error)
    return f"{missing} is missing (needed to load {os.path.basename(path)})" if missing else error


def _find(ctx: DoctorContext, dirs: Sequence[str], pattern: str) -> Tuple[str, ...]:
    regex = re.compile(pattern)
    hits = []
    for directory in dirs:
        for name in list_dir(ctx.root, directory) or ():
            if regex.fullmatch(name):
                hits.append(os.path.join(directory, name))
    return tuple(hits)


def _distinct_files(ctx: DoctorContext, paths: Sequence[str]) -> Tuple[str, ...]:
    """paths less those naming a file named before: a merged-/usr image (Ubuntu's, NGC's, LUMI's)
    has /lib -> usr/lib and /lib64 -> usr/lib64, so ld.so's search meets one file under two
    names, and it is one library, not one shadowing another."""
    seen: set = set()
    kept = []
    for path in paths:
        real = os.path.realpath(under(ctx.root, path))
        if real not in seen:
            seen.add(real)
            kept.append(path)
    return tuple(kept)


def host_libraries(env: Mapping[str, str], accelerator: Accelerator) -> Tuple[HostLibrary, ...]:
    """The Slingshot host libraries, in load order (containers/sites/fabrics/slingshot.json), with the
    vendor's collective library and net plugin named."""
    return tuple(for_accelerator(library, accelerator) for library in load_fabric_defaults("slingshot", env).host_libraries)


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
    if fabric_expected(ctx) != "slingshot":
        return (Check("host libraries", SKIP, "no Slingshot fabric expected; the image's own NCCL is used"),)
    groups = _loader_dirs(ctx)
    dirs = _search_order(groups)
    checks = []
    vendor = ctx.accelerator
    plugin, ofi_variant = vendor.net_plugin, vendor.net_plugin.replace(".so", "-ofi.so")
    for library in host_libraries(ctx.env, vendor):
        label = library.label
        hits = _distinct_files(ctx, _find(ctx, dirs, library.file))
        if not hits and label == OFI_PLUGIN_LABEL and _find(ctx, dirs, re.escape(ofi_variant)):
            checks.append(Check(label, WARN, f"only {ofi_variant} found; {vendor.collective} dlopens {plugin} unless NCCL_NET_PLUGIN=ofi",
                                f"bind a plugin directory that has {plugin} (the {vendor.ofi_plugin} module provides the link)"))
            continue
        if not hits:
            # On a Slingshot node, or in a multi-node job, training across nodes cannot work without
            # it; elsewhere (a login node without CXI, the image's %test) it is not fatal yet.
            status = FAIL if library.required and (ctx.multi_node or ctx.facts.slingshot_present) else WARN
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
    cudart_dirs = dirs + ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/sbsa-linux/lib", "/usr/local/cuda/targets/x86_64-linux/lib")
    runtime = vendor.plugin_dlopens
    if _find(ctx, cudart_dirs, re.escape(runtime)):
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
    found, seen = [], set()
    for group in ("first", "prepend", "append"):
        for directory in groups[group]:
            for name in list_dir(ctx.root, directory) or ():
                path = os.path.join(directory, name)
                real = os.path.realpath(under(ctx.root, path))
                if (name.endswith(".so") or ".so." in name) and os.path.isfile(real) and real not in seen:
                    seen.add(real)
                    found.append((path, group))
    return tuple(found)


def check_library_dependencies(ctx: DoctorContext) -> Check:
    """Every bound host library loads with the workers' LD_LIBRARY_PATH, or the missing one is named.

    A dependency that `ddp-launch binds` could not bind (or binds from an old checkout
    did not) shows here as glibc's "libX.so.N: cannot open shared object file".
    """
    name = "library dependencies"
    bound = _bound_libraries(ctx)
    if not bound:
        return Check(name, SKIP, "no bound host libraries in this container")
    library_path = ":".join(under(ctx.root, d) for d in _library_dirs(ctx))
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


def fi_info_candidates(ctx: DoctorContext) -> Tuple[str, ...]:
    """Where the binds put fi_info (<target>/bin of each bound directory, from the site profile), then PATH."""
    found = []
    for spec in ctx.profile.binds if ctx.profile else ():
        candidate = f"{spec.target.rstrip('/')}/bin/fi_info"
        if os.access(under(ctx.root, candidate), os.X_OK) and os.path.isfile(under(ctx.root, candidate)):
            found.append(under(ctx.root, candidate))
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
    library_path = ":".join(under(ctx.root, d) for d in _library_dirs(ctx))
    # ld.so reads LD_LIBRARY_PATH only at start, so the bound libfabric reaches fi_info through env(1).
    argv = ["env", f"LD_LIBRARY_PATH={library_path}"] if library_path else []
    code, output = ctx.probes.run_command(argv + [candidates[0], "-p", "cxi"])
    first = next((line.strip() for line in output.splitlines() if line.strip()), "")
    if code != 0:
        return Check("fi_info -p cxi", FAIL, f"exit {code}: {first}", "libfabric cannot open the CXI provider: check the cxi devices and the libfabric version")
    return Check("fi_info -p cxi", OK, first)


def driver_version(root: str, accelerator: Accelerator) -> Optional[Tuple[int, int]]:
    """The kernel driver's major.minor: NVIDIA's /proc/driver/nvidia/version line ("Kernel Module
    550.54.15"), or a file that holds the version alone (/sys/module/amdgpu/version: "6.8.5")."""
    text = read_text(root, accelerator.driver_version_file) or ""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+)\.(\d+)", text) or re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def check_cuda_driver(ctx: DoctorContext) -> Check:
    """The kernel driver against the image's runtime (CUDA, HIP), where a minimum is published."""
    vendor = ctx.accelerator
    runtime, name = vendor.runtime, f"{vendor.runtime} driver"
    driver = driver_version(ctx.root, vendor)
    if driver is None:
        return Check(name, SKIP, f"no {vendor.name.upper()} driver ({vendor.driver_version_file})")
    info = ctx.probes.torch_info() or {}
    image = ctx.env.get(f"{runtime}_VERSION") or info.get(runtime.lower())
    if not image:
        return Check(name, OK, f"driver {driver[0]}.{driver[1]}; image {runtime} unknown")
    major = int(str(image).split(".")[0])
    needed = MIN_DRIVER.get(runtime, {}).get(major)
    if needed and driver[0] < needed:
        return Check(name, WARN, f"driver {driver[0]}.{driver[1]} is older than {runtime} {image} needs (>= {needed})",
                     "use an image built for the host's CUDA, or forward compatibility (cuda-compat) on data-centre GPUs")
    return Check(name, OK, f"driver {driver[0]}.{driver[1]} runs the image's {runtime} {image}")


def check_interface(ctx: DoctorContext) -> Check:
    value = planned(ctx, "NCCL_SOCKET_IFNAME")
    interfaces = ctx.facts.net_interfaces
    for finding in ctx.fabric.findings:
        if finding.topic in ("interface", "route") and finding.severity in ("warning", "error"):
            status = FAIL if finding.severity == "error" else WARN
            return Check("interface", status, finding.text, "unset NCCL_SOCKET_IFNAME or name an interface from `ip -br link`")
    if not value:
        return Check("interface", OK, "NCCL_SOCKET_IFNAME unset; NCCL picks the interface")
    if value.lstrip("=").split(",")[0] == "lo":
        # Rank 0 advertises this interface's address to the other nodes: loopback reaches none.
        return Check("interface", FAIL if ctx.multi_node else WARN,
                     f"NCCL_SOCKET_IFNAME={value} is loopback: no other node can reach this one through it",
                     "unset NCCL_SOCKET_IFNAME or name the interface of the nodes' network (`ip -br addr`)")
    if interfaces is None:
        return Check("interface", SKIP, f"NCCL_SOCKET_IFNAME={value}; /sys/class/net cannot be listed")
    problem = check_socket_ifname(value, interfaces)
    if problem:
        return Check("interface", FAIL, problem, "unset NCCL_SOCKET_IFNAME or name an interface from `ip -br link`")
    return Check("interface", OK, f"NCCL_SOCKET_IFNAME={value}")


def check_head_node(ctx: DoctorContext) -> Check:
    """The launch plan's rendezvous endpoint, at the address the launcher's probe found for it."""
    if ctx.offline:
        return Check("head node", SKIP, "--offline")
    endpoint = ctx.launch.rendezvous if ctx.launch is not None else None
    if endpoint is None or endpoint.port is None:
        why = "the launch plan has none" if ctx.launch is not None else "no launch plan (see the launch plan check)"
        return Check("head node", SKIP, f"no rendezvous endpoint to try: {why}")
    host, port = endpoint.host, endpoint.port
    problem = host_name_problem(host)
    if problem is not None:
        return Check("head node", FAIL, f"{host!r} is not a valid host name ({problem})",
                     "set --rdzv-host / DDP_LAUNCH_RDZV_HOST to the head node's name or IPv4 address")
    address = ctx.facts.address_of(host)
    if address is None:
        return Check("head node", FAIL, f"{host} does not resolve to an IPv4 address here",
                     "use the head node's IP (--rdzv-host) or fix DNS")
    if ctx.facts.head is not None and ctx.facts.head.address == address and ctx.facts.head.name != address:
        host = ctx.facts.head.name  # the plan carries the address; say which node it is
    outcome = ctx.probes.connect(address, port, 3.0)
    if outcome == "open":
        return Check("head node", OK, f"{host} ({address}) port {port} accepts connections")
    if outcome == "refused":
        return Check("head node", OK, f"{host} ({address}) reachable; port {port} not listening yet (normal before the launch)")
    return Check("head node", FAIL, f"{host} ({address}) port {port}: {outcome}",
                 "a firewall or the wrong interface blocks the rendezvous; pick another --rdzv-port or --rdzv-host")


# A container runtime's default /dev/shm is 64 MiB (docker run --shm-size; Kubernetes has no
# field for it, kubernetes#28272); NCCL between a node's GPUs needs more (NCCL troubleshooting,
# "Shared memory": --shm-size=1g). runai/pod.sh refuses the same size.
MIN_SHM_BYTES = 1 << 30


def check_shm(ctx: DoctorContext) -> Check:
    info = ctx.probes.torch_info() or {}
    gpus = info.get("cuda_device_count")
    gpus = gpus if isinstance(gpus, int) else ctx.facts.gpu_device_files
    size = ctx.probes.filesystem_bytes(under(ctx.root, "/dev/shm"))
    if size is None:
        return Check("/dev/shm", SKIP, "cannot read the size of /dev/shm")
    detail = f"{size >> 20} MiB"
    if gpus > 1 and size < MIN_SHM_BYTES:
        return Check("/dev/shm", FAIL, f"{detail}, and NCCL between the {gpus} GPUs here needs at least 1 GiB",
                     "RunAI: submit with --large-shm; Docker: --shm-size=1g; Kubernetes: an emptyDir "
                     "with medium Memory at /dev/shm")
    return Check("/dev/shm", OK, detail)


def check_dataset(ctx: DoctorContext) -> Check:
    folder = os.path.join(ctx.data_dir, DATASET_DIRNAME)
    missing = missing_dataset_files(ctx.data_dir)
    if missing:
        return Check("dataset", WARN, f"{folder} lacks {', '.join(missing)}",
                     "fetch it once on the login node: make data (compute nodes may be offline)")
    return Check("dataset", OK, f"CIFAR-100 at {folder}")


def check_image_mount(ctx: DoctorContext) -> Check:
    from ddp_launch import image_mount
    facts = image_mount.probe(ctx.env, proc=under(ctx.root, "/proc"), sys_block=under(ctx.root, "/sys/block"))
    status, detail, fix = image_mount.describe(image_mount.classify(facts), facts.image)
    return Check("image mount", status, detail, fix)


def run_checks(ctx: DoctorContext) -> Tuple[Check, ...]:
    checks = [check_launch_plan(ctx), check_image_mount(ctx), check_gpus(ctx), check_gpu_health(ctx), check_torch(ctx),
              check_cuda_driver(ctx), check_fabric_devices(ctx), check_fabric_settings(ctx)]
    checks.extend(check_host_libraries(ctx))
    checks.append(check_library_dependencies(ctx))
    checks.extend([check_fi_info(ctx), check_interface(ctx), check_head_node(ctx), check_shm(ctx),
                   check_dataset(ctx)])
    return tuple(checks)


# --- real probes ------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def real_torch_info() -> Optional[Dict[str, object]]:
    try:
        import torch  # noqa: PLC0415 - optional, and slow: only when doctor runs
    except Exception:  # a broken install raises more than ImportError
        return None
    info: Dict[str, object] = {"version": torch.__version__, "cuda": torch.version.cuda,
                               "hip": getattr(torch.version, "hip", None)}
    try:
        info["cuda_device_count"] = torch.cuda.device_count()
        if torch.cuda.is_available():
            info["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception as exc:  # CUDA init errors are themselves the finding
        info["cuda_error"] = str(exc)
    return info


def real_load_library(path: str, kind: str) -> str:
    """dlopen with RTLD_GLOBAL so later libraries (the plugin) find earlier ones by soname."""
    library = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    symbol = {"libfabric": "fi_version", "nccl": "ncclGetVersion"}.get(kind)
    if symbol is not None and not hasattr(library, symbol):
        # It loads, but it is not the library its name promises (a stub, a wrong build).
        return f"version unknown: no {symbol} in it"
    if kind == "libfabric":
        library.fi_version.restype = ctypes.c_uint32
        value = library.fi_version()
        return f"libfabric {value >> 16}.{value & 0xFFFF}"
    if kind == "nccl":
        number = ctypes.c_int()
        if library.ncclGetVersion(ctypes.byref(number)) == 0:
            code = number.value
            major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
            return f"NCCL {major}.{rest // 100}.{rest % 100}"
    return ""


def real_run_command(argv: Sequence[str]) -> Tuple[int, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, done.stdout + done.stderr


def real_connect(address: str, port: int, timeout: float) -> str:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return f"no answer within {timeout:.0f} s"
    except OSError as exc:
        return f"error: {exc}"


REAL_PROBES = Probes(real_torch_info, real_load_library, real_run_command, real_connect)
