"""What exactly ran: the run's manifest (<run-dir>/manifest.json) and its three lines in the job output.

Written by the trainer (every rank's libraries, a collective) and, for a user's own workload, by the
worker that runs it as rank 0 (ddp_launch.worker: its own process's libraries). No torch: ddp-bench reads it.

Libraries are read from /proc/self/maps once the process group is up, with their real paths
and the version their file name carries: package metadata can name another build than the
one loaded (bergson#426: metadata said NCCL 2.26.2 while 2.28 was loaded). Each library's
mount (/proc/self/mountinfo) says whether the image holds it or a bind brought it from the
host. Variables carry who set them: the launcher passes its plan's reasons (DDP_ENV_SOURCES); the
settings NCCL reads from its config files are recorded with their effect (ddp_contract.nccl_conf), and
the known problems (ddp_contract.known_issues) that match what each node mapped.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from ddp_contract import ENV_SOURCES_VAR, known_issues, nccl_conf
from ddp_contract.errors import LaunchError
from ddp_contract.heartbeat import FR_DUMP_VARS, flight_recorder_prefix

MANIFEST_NAME = "manifest.json"
ENV_PREFIXES = ("NCCL_", "FI_", "GLOO_", "TORCH_")
# The libraries a distributed run's behaviour hangs on: (label, pattern on the file name).
KEY_LIBRARIES = (
    ("nccl", re.compile(r"^lib[nr]ccl\.so")),          # RCCL keeps NCCL's API, ncclGetVersion included
    ("net plugin", re.compile(r"^lib[nr]ccl-net.*\.so")),
    ("libfabric", re.compile(r"^libfabric\.so")),
    ("libcxi", re.compile(r"^libcxi\.so")),
    ("cuda runtime", re.compile(r"^libcudart\.so")),
    ("cuda driver", re.compile(r"^libcuda\.so")),
    ("torch", re.compile(r"^libtorch_(cpu|cuda)\.so")),
    ("gloo", re.compile(r"^libgloo.*\.so")),
)
IMAGE_VARS = ("APPTAINER_CONTAINER", "APPTAINER_NAME", "SINGULARITY_CONTAINER", "SINGULARITY_NAME")
LABELS_FILE = known_issues.IMAGE_LABELS_FILE  # Apptainer: %labels and the build's own, inside the container
SITE_VAR = "DDP_LAUNCH_SITE"  # the image's default site (gpu.def %environment), or the one the launcher was given
REVISION_LABEL = "org.opencontainers.image.revision"
_VERSION = re.compile(r"\.so\.(\d+(?:\.\d+)*)$")


@dataclass(frozen=True)
class Library:
    path: str               # the real path (symlinks resolved)
    version: Optional[str]  # from the real file name: libnccl.so.2.28.3 -> 2.28.3
    mount: str              # the mount point it lies under ("/" is the image's root in a container)
    mount_source: str       # that mount's root in its filesystem (a bind's host directory)

    @property
    def bound(self) -> bool:
        return self.mount != "/"


def mapped_libraries(maps: str) -> list[str]:
    """The shared objects of /proc/self/maps text, each once, in order (pure)."""
    seen: dict[str, None] = {}
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and ".so" in parts[5] and parts[5].startswith("/"):
            seen.setdefault(parts[5].removesuffix(" (deleted)"), None)
    return list(seen)


def mounts(mountinfo: str) -> list[tuple[str, str]]:
    """(mount point, root within its filesystem) per line of /proc/self/mountinfo (proc(5))."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4:
            out.append((_unescape(fields[4]), _unescape(fields[3])))
    return out


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str, table: Sequence[tuple[str, str]]) -> tuple[str, str]:
    best = ("/", "/")
    for point, root in table:
        prefix = point.rstrip("/") + "/"
        if (path == point or path.startswith(prefix)) and len(point) >= len(best[0]):
            best = (point, root)
    return best


def describe_library(path: str, table: Sequence[tuple[str, str]]) -> Library:
    real = os.path.realpath(path)
    match = _VERSION.search(os.path.basename(real))
    point, root = mount_of(real, table)
    return Library(real, match.group(1) if match else None, point, root)


def key_libraries(libraries: Iterable[Library], ask: bool = True) -> dict[str, list[dict[str, Any]]]:
    """The key libraries among the mapped ones; ask: their version from the loaded code itself."""
    found: dict[str, list[dict[str, Any]]] = {}
    for lib in libraries:
        name = os.path.basename(lib.path)
        for label, pattern in KEY_LIBRARIES:
            if pattern.match(name):
                loaded = loaded_version(label, lib.path) if ask else None
                found.setdefault(label, []).append({**asdict(lib), "version": loaded or lib.version,
                                                    "bound": lib.bound})
    return found


def loaded_version(label: str, path: str) -> Optional[str]:
    """The version the library itself reports, asked through the copy already mapped (dlopen of a
    loaded path returns that handle): the soname says only "2" for NCCL."""
    import ctypes
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        code = ctypes.c_int(0)
        if label == "nccl" and lib.ncclGetVersion(ctypes.byref(code)) == 0:  # 2.9+: X*10000+Y*100+Z
            return f"{code.value // 10000}.{code.value // 100 % 100}.{code.value % 100}"
        if label == "cuda runtime" and lib.cudaRuntimeGetVersion(ctypes.byref(code)) == 0:
            return f"{code.value // 1000}.{code.value % 1000 // 10}"
        if label == "cuda driver" and lib.cuDriverGetVersion(ctypes.byref(code)) == 0:
            return f"{code.value // 1000}.{code.value % 1000 // 10}"
        if label == "libfabric":
            lib.fi_version.restype = ctypes.c_uint32
            packed = lib.fi_version()  # FI_VERSION(major, minor) = major << 16 | minor (fi_version(3))
            return f"{packed >> 16}.{packed & 0xFFFF}"
        if label == "torch":
            import torch
            return str(torch.__version__)
        if label == "net plugin":
            return known_issues.plugin_version(path)
    except (OSError, AttributeError):
        return None
    return None


def environment(env: Mapping[str, str], launcher_sources: Mapping[str, str],
                trainer_set: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Every NCCL_/FI_/GLOO_/TORCH_ variable with its value and who set it (pure)."""
    out = {}
    for name in sorted(env):
        if not name.startswith(ENV_PREFIXES):
            continue
        if name in trainer_set:
            who = f"trainer: {trainer_set[name]}"
        elif name in launcher_sources:
            who = launcher_sources[name]
        else:
            who = "user: set before ddp-launch ran (the environment or the job script)"
        out[name] = {"value": env[name], "set_by": who}
    return out


def launcher_sources(env: Mapping[str, str]) -> dict[str, str]:
    try:
        sources = json.loads(env.get(ENV_SOURCES_VAR) or "{}")
    except ValueError:
        return {}
    return sources if isinstance(sources, dict) else {}


def image(env: Mapping[str, str], labels_file: str = LABELS_FILE) -> dict[str, Any]:
    labels: dict[str, Any] = {}
    try:
        with open(labels_file) as f:
            labels = json.load(f)
    except (OSError, ValueError):
        pass
    return {"ids": {name: env[name] for name in IMAGE_VARS if env.get(name)}, "labels": labels}


def source_revision(labels: Mapping[str, Any]) -> Optional[str]:
    """The image's revision label, else the git commit of the checkout the trainer runs from."""
    if labels.get(REVISION_LABEL):
        return str(labels[REVISION_LABEL])
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def host_driver(path: str = "/proc/driver/nvidia/version") -> Optional[str]:
    try:
        with open(path) as f:
            return f.readline().strip() or None
    except OSError:
        return None


def this_process(proc: str = "/proc/self") -> dict[str, Any]:
    """This worker's libraries (all, and the key ones) as its process maps them now."""
    with open(f"{proc}/maps") as f:
        paths = mapped_libraries(f.read())
    with open(f"{proc}/mountinfo") as f:
        table = mounts(f.read())
    libraries = [describe_library(p, table) for p in paths]
    return {"host": socket.gethostname(), "key_libraries": key_libraries(libraries),
            "libraries": [{**asdict(lib), "bound": lib.bound} for lib in libraries]}


def _first_version(libraries: Mapping[str, Any], label: str) -> Optional[str]:
    found = libraries.get(label) or []
    return found[0].get("version") if found else None


def site_gpu(env: Mapping[str, str]) -> tuple[Optional[str], Optional[str]]:
    """(accelerator, gpu) of the site profile the run names, or (None, None) without one that reads."""
    if not env.get(SITE_VAR):
        return None, None
    from ddp_contract.sites import load_site
    try:
        profile = load_site(env[SITE_VAR], env)
    except LaunchError:
        return None, None
    return profile.accelerator, profile.gpu


def stack_of(libraries: Mapping[str, Any], env: Mapping[str, str], settings: Mapping[str, str],
             labels: Mapping[str, Any], driver: Optional[str], nodes: int) -> known_issues.Stack:
    """The known-issues stack of one node from what its first rank mapped (key_libraries), as the
    doctor's (ddp_launch/doctor/stack.py) from what it would load."""
    accelerator, gpu = site_gpu(env)
    versions = {"nccl": _first_version(libraries, "nccl"), "aws-ofi-nccl": _first_version(libraries, "net plugin"),
                "libfabric": _first_version(libraries, "libfabric"), "libcxi": _first_version(libraries, "libcxi"),
                "torch": _first_version(libraries, "torch"), "driver": known_issues.driver_version(driver),
                "nodes": str(nodes), "base_image": labels.get(known_issues.BASE_LABEL),
                "accelerator": accelerator, "gpu": gpu, "machine": os.uname().machine}
    where = {"nccl": "nccl", "aws-ofi-nccl": "net plugin", "libfabric": "libfabric", "libcxi": "libcxi"}
    return known_issues.Stack(versions, {name: (libraries.get(label) or [{}])[0].get("path", "")
                                         for name, label in where.items()}, settings)


def known_issue_record(per_node: Mapping[str, Mapping[str, Any]], env: Mapping[str, str],
                       conf: Sequence[nccl_conf.ConfLine], labels: Mapping[str, Any],
                       driver: Optional[str]) -> dict[str, Any]:
    """The known problems (ddp_contract.known_issues) that match what each node mapped: {"rows": N,
    "matches": [row's record with its nodes]}, or {"error": why} where the rows cannot be read."""
    try:
        rows = known_issues.load_rows(env)
    except LaunchError as error:
        return {"error": str(error)}
    settings = {**nccl_conf.applied(conf), **env}
    found: dict[str, dict[str, Any]] = {}
    for host, libraries in per_node.items():
        for matched in known_issues.matches(rows, stack_of(libraries, env, settings, labels, driver, len(per_node))):
            found.setdefault(matched.row.id, {**matched.record(), "nodes": []})["nodes"].append(host)
    return {"rows": len(rows), "matches": list(found.values())}


def manifest(config: Mapping[str, Any], env: Mapping[str, str], trainer_set: Mapping[str, str],
             ranks: Sequence[Mapping[str, Any]], torch_version: str) -> dict[str, Any]:
    """The manifest from every rank's this_process() (rank order) and rank 0's environment."""
    img = image(env)
    nodes: dict[str, list[int]] = {}
    for rank, seen in enumerate(ranks):
        nodes.setdefault(seen["host"], []).append(rank)
    per_node = {host: ranks[members[0]]["key_libraries"] for host, members in nodes.items()}
    conf = nccl_conf.settings(env, _first_version(ranks[0]["key_libraries"], "nccl"))
    driver = host_driver()
    return {
        "image": {**img, "revision": source_revision(img["labels"])},
        "torch": torch_version,
        "libraries": ranks[0]["key_libraries"],
        "libraries_per_node": per_node,
        "all_libraries_rank0": ranks[0]["libraries"],
        "host_driver": driver,
        "environment": environment(env, launcher_sources(env), trainer_set),
        # What NCCL reads from /etc/nccl.conf, ~/.nccl.conf or $NCCL_CONF_FILE, and whether it applies.
        "nccl_conf": [line.record() for line in conf],
        "known_issues": known_issue_record(per_node, env, conf, img["labels"], driver),
        "nodes": nodes,
        "rank_map": {str(rank): seen["host"] for rank, seen in enumerate(ranks)},
        "config": dict(config),
    }


def summary_lines(m: Mapping[str, Any]) -> tuple[str, str, str]:
    """The manifest's three lines for the job output."""
    img = m["image"]
    where = img["ids"].get("APPTAINER_CONTAINER") or img["ids"].get("SINGULARITY_CONTAINER") or "none (not in Apptainer)"
    name = img["ids"].get("APPTAINER_NAME") or img["ids"].get("SINGULARITY_NAME")
    image_line = (f"Image: {where}" + (f" ({name})" if name else "") + f", {len(img['labels'])} label(s), "
                  f"revision {img['revision'] or 'unknown'}; driver: {m['host_driver'] or 'none'}")
    libs = []
    for label, found in m["libraries"].items():
        for lib in found:
            bound = f", bound from the host at {lib['mount']}" if lib["bound"] else ""
            libs.append(f"{label} {lib['version'] or '?'} {lib['path']}{bound}")
    keys = {lib["path"] for found in m["libraries"].values() for lib in found}
    bound = [lib for lib in m["all_libraries_rank0"] if lib["bound"] and lib["path"] not in keys]
    if bound:
        libs.append(f"{len(bound)} more from host binds: " + ", ".join(lib["path"] for lib in bound[:5])
                    + (", ..." if len(bound) > 5 else ""))
    lib_line = f"Libraries (mapped, torch {m['torch']}): " + ("; ".join(libs) or "none of the key ones")
    by_who: dict[str, list[str]] = {}
    for name, item in m["environment"].items():
        by_who.setdefault(item["set_by"].split(":")[0], []).append(f"{name}={item['value']}")
    nodes = ", ".join(f"{host} (ranks {_span(r)})" for host, r in m["nodes"].items())
    env_line = ("Environment: " + "; ".join(f"by {who}: {' '.join(v)}" for who, v in by_who.items())
                + f"; nodes: {nodes}")
    return image_line, lib_line, env_line


def _span(ranks: Sequence[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks[-1] - ranks[0] == len(ranks) - 1 \
        else ",".join(map(str, ranks))


def record(run_dir: str, config: Mapping[str, Any], environ: Mapping[str, str], every_rank: Sequence[Mapping[str, Any]],
           torch_version: str) -> tuple[str, str, str]:
    """Rank 0's part: the manifest from every rank's this_process(), written to the run dir, and its
    three lines. The Flight Recorder's variables that hold the trainer's own prefix are named as set
    by the trainer (safety.heartbeat.use_run_dir_for_flight_recorder)."""
    prefix = flight_recorder_prefix(run_dir)
    trainer_set = {name: "Flight Recorder dumps into <run-dir>/forensics" for name in FR_DUMP_VARS
                   if environ.get(name) == prefix}
    m = manifest(config, environ, trainer_set, every_rank, torch_version)
    write(run_dir, m)
    return summary_lines(m)


def write(run_dir: str | Path, m: Mapping[str, Any]) -> Path:
    path = Path(run_dir) / MANIFEST_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(m, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def workload_manifest(workload: Mapping[str, Any], env: Mapping[str, str], seen: Mapping[str, Any],
                      torch_version: Optional[str]) -> dict[str, Any]:
    """A user's workload's manifest, from the process of its rank 0 (this_process(): the libraries it had
    mapped when it was taken) and its environment: what ran (the script or module, its file's digest and its
    arguments), in which image, with which libraries and variables. Its other ranks' libraries are not in it:
    gathering them takes a collective, which only the workload can run."""
    img = image(env)
    return {
        "workload": dict(workload),
        "recorded_by": "ddp-launch's worker of rank 0 (its own process's mapped libraries)",
        "image": {**img, "revision": source_revision(img["labels"])},
        "torch": torch_version,
        "libraries": seen["key_libraries"],
        "all_libraries_rank0": seen["libraries"],
        "host": seen["host"],
        "host_driver": host_driver(),
        "environment": environment(env, launcher_sources(env), {}),
    }


def file_digest(path: str) -> Optional[str]:
    """sha256 of a file, to tell which version of a script ran; None when it cannot be read."""
    import hashlib
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()
