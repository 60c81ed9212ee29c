"""Site profiles: what a cluster needs (host library binds, environment), read from data.

Runs on the HOST in job scripts (SLES 15's python3 is 3.6) and inside the image,
so it uses only the standard library and Python 3.6 syntax (`make lint` checks it
with vermin). Profiles are JSON (tomllib is 3.11+); every value carries its source
so --dry-run can cite it.
"""

import glob
import json
import os
import re
import sys
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, TextIO, Tuple

from ddp_launch.errors import LaunchError, run_main
from ddp_launch.flags import FlagParser

SITES_DIR_VAR = "DDP_SITES_DIR"
FABRICS = ("slingshot", "infiniband", "ethernet", "auto")
LIBRARY_ORDERS = ("first", "prepend", "append")
# The GPU vendors with data in containers/sites/accelerators (ddp_launch.accelerators); a profile
# without "accelerator" means the first, so profiles written before AMD keep working.
ACCELERATORS = ("nvidia", "amd")
# The command that runs the image on the site (and the variable its binds go in, <COMMAND>_BIND):
# Apptainer, or SingularityCE where a site has only that (LUMI). Absent: the first.
CONTAINER_RUNTIMES = ("apptainer", "singularity")
_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


# Records are typing.NamedTuple, not dataclasses: dataclasses are Python 3.7+ and
# this module runs on the 3.6 python3 of SLES 15 login and batch nodes.
class EnvDefault(NamedTuple):
    """One variable a site sets when the user has not, and where the value comes from."""

    name: str
    value: str
    source: str


class SrunArg(NamedTuple):
    """An option the site's training steps give srun (the job scripts ask: python3 -m ddp_launch.sites)."""

    value: str
    source: str


class BindSpec(NamedTuple):
    """A host path found by module root (env) or newest glob match, bound at target.

    library_path / include_path are container paths added to LD_LIBRARY_PATH /
    CPATH inside the image (only those that exist there). order: "first" for the
    NCCL net plugin (it must win over any copy bundled in the base image),
    "prepend" for libfabric/CXI/NCCL, "append" for everything else.
    """

    name: str
    target: str
    source: str
    env: Optional[str] = None
    glob: Optional[str] = None
    required: bool = True
    library_path: Tuple[str, ...] = ()
    include_path: Tuple[str, ...] = ()
    order: str = "prepend"
    hint: str = ""


class ClosureSpec(NamedTuple):
    """Where `ddp-launch binds` puts the host libraries that the bound ones need.

    target: a container directory on some bind's library_path; each dependency
    is bound there as one file named by its soname.
    """

    target: str
    source: str


class SiteProfile(NamedTuple):
    name: str
    description: str
    fabric: str
    gpu: Optional[str]
    binds: Tuple[BindSpec, ...]
    env: Tuple[EnvDefault, ...]
    path: str
    closure: Optional[ClosureSpec] = None
    fabric_gate: Optional[Dict[str, object]] = None  # the bus bandwidth the fabric gate expects, with its source
    accelerator: str = ACCELERATORS[0]  # the GPU vendor: containers/sites/accelerators/<accelerator>.json
    srun_args: Tuple[SrunArg, ...] = ()  # options for the srun of the training step and the fabric gate
    container_runtime: str = CONTAINER_RUNTIMES[0]  # the command that runs the image there

    def env_value(self, name: str) -> Optional[EnvDefault]:
        for item in self.env:
            if item.name == name:
                return item
        return None


def sites_dirs(env: Mapping[str, str]) -> Tuple[str, ...]:
    """Where profiles live: $DDP_SITES_DIR, else next to the package (repo or image layout)."""
    if env.get(SITES_DIR_VAR):
        return (env[SITES_DIR_VAR],)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = os.path.dirname(package_parent)
    # Repo: <repo>/entrypoints/ddp_launch -> <repo>/containers/sites.
    # Image: /opt/ddp/python/ddp_launch -> /opt/ddp/sites.
    return (os.path.join(base, "containers", "sites"), os.path.join(base, "sites"))


def available_sites(env: Mapping[str, str]) -> Tuple[str, ...]:
    names = set()
    for directory in sites_dirs(env):
        if os.path.isdir(directory):
            names.update(n[:-5] for n in os.listdir(directory) if n.endswith(".json"))
    return tuple(sorted(names))


def load_site(name: str, env: Mapping[str, str]) -> SiteProfile:
    """Find and validate the profile called name; LaunchError names the problem."""
    if not _NAME_PATTERN.match(name):
        raise LaunchError(f"site name {name!r} is not valid; use lower-case letters, digits, '-' or '_'")
    for directory in sites_dirs(env):
        path = os.path.join(directory, name + ".json")
        if os.path.isfile(path):
            return read_profile(path)
    known = ", ".join(available_sites(env)) or "none found"
    searched = ", ".join(sites_dirs(env))
    raise LaunchError(
        f"unknown site {name!r} (known: {known}; searched {searched}); "
        f"pass --site with one of those or set {SITES_DIR_VAR}"
    )


def read_json_file(path: str, what: str) -> object:
    """A JSON document (a site profile, the fabric defaults); one line naming the file when it is bad."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{what} {path} cannot be read: {exc}; fix the file") from None


def read_profile(path: str) -> SiteProfile:
    return parse_profile(read_json_file(path, "site profile"), path)


def parse_profile(data: object, path: str) -> SiteProfile:
    """Validate the JSON document; every problem names the file and the key."""

    def fail(what: str) -> LaunchError:
        return LaunchError(f"bad site profile {path}: {what}")

    if not isinstance(data, dict):
        raise fail("the top level must be a JSON object")
    allowed = {"schema", "name", "description", "fabric", "accelerator", "gpu", "binds", "env", "closure", "fabric_gate",
               "srun_args", "container_runtime"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    if type(data.get("schema")) is not int or data.get("schema") != 1:  # not true, not 1.0
        raise fail(f"'schema' must be 1, got {data.get('schema')!r}")
    name = _string(data, "name", fail)
    expected = os.path.basename(path)[:-5] if path.endswith(".json") else name
    if name != expected:
        raise fail(f"'name' is {name!r} but the file is named {expected}.json")
    fabric = _string(data, "fabric", fail)
    if fabric not in FABRICS:
        raise fail(f"'fabric' must be one of {', '.join(FABRICS)}, got {fabric!r}")
    gpu = data.get("gpu")
    if gpu is not None and not isinstance(gpu, str):
        raise fail("'gpu' must be a string or null")
    accelerator = data.get("accelerator", ACCELERATORS[0])
    if accelerator not in ACCELERATORS:
        raise fail(f"'accelerator' must be one of {', '.join(ACCELERATORS)}, got {accelerator!r}")
    binds = tuple(_bind(item, index, fail) for index, item in enumerate(_list(data, "binds", fail)))
    targets = [b.target for b in binds]
    duplicates = sorted({t for t in targets if targets.count(t) > 1})
    if duplicates:
        raise fail(f"two binds share the target {duplicates[0]}")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise fail("'description' must be a string")
    env_data = data.get("env", {})
    if not isinstance(env_data, dict):
        raise fail("'env' must be an object of NAME: {\"value\": ..., \"source\": ...}")
    env = tuple(_env_default(key, value, fail) for key, value in sorted(env_data.items()))
    return SiteProfile(
        name=name,
        description=description,
        fabric=fabric,
        gpu=gpu,
        binds=binds,
        env=env,
        path=path,
        closure=_closure(data.get("closure"), binds, fail),
        fabric_gate=_fabric_gate(data.get("fabric_gate"), fail),
        accelerator=accelerator,
        srun_args=tuple(_srun_arg(item, index, fail) for index, item in enumerate(_list(data, "srun_args", fail))),
        container_runtime=_container_runtime(data.get("container_runtime"), fail),
    )


def _srun_arg(item: object, index: int, fail) -> SrunArg:
    """One srun option, one word ("--network=disable_rdzv_get"), with its source."""
    if not isinstance(item, dict) or set(item) != {"value", "source"}:
        raise fail(f"srun_args[{index}] must be an object with exactly 'value' and 'source'")
    value, source = item["value"], item["source"]
    if not isinstance(value, str) or not value.startswith("--") or any(c.isspace() for c in value):
        raise fail(f"srun_args[{index}].value must be one srun option word starting with '--', got {value!r}")
    if not isinstance(source, str) or not source:
        raise fail(f"srun_args[{index}].source must say where the option comes from")
    return SrunArg(value, source)


def _container_runtime(item: object, fail) -> str:
    """{"command": "singularity", "source": "..."}: the site's runtime, with where that is said."""
    if item is None:
        return CONTAINER_RUNTIMES[0]
    if not isinstance(item, dict) or set(item) != {"command", "source"}:
        raise fail("'container_runtime' must be {\"command\": \"apptainer\" or \"singularity\", \"source\": \"...\"}")
    if item["command"] not in CONTAINER_RUNTIMES:
        raise fail(f"'container_runtime'.command must be one of {', '.join(CONTAINER_RUNTIMES)}, got {item['command']!r}")
    if not isinstance(item["source"], str) or not item["source"]:
        raise fail("'container_runtime'.source must say where the site's runtime is documented")
    return item["command"]


# The fabric gate's expectation: a published all-reduce bus bandwidth at one size, the share of it
# below which the gate fails, and where the figure comes from (src/ddp_train/fabric_gate.py).
_GATE_NUMBERS = ("size_bytes", "busbw_gbps", "floor_fraction")
# The figure judges only a gate run with the backend and device it was measured with (nccl-tests:
# nccl on cuda, which is RCCL on ROCm's torch); torch.distributed's names.
_GATE_MEASURED_WITH = {"backend": ("nccl", "gloo"), "device": ("cuda", "cpu")}


def _fabric_gate(item: object, fail) -> Optional[Dict[str, object]]:
    if item is None:
        return None
    if not isinstance(item, dict):
        raise fail("'fabric_gate' must be an object with size_bytes, busbw_gbps, floor_fraction, source, "
                   "backend and device")
    allowed = set(_GATE_NUMBERS) | set(_GATE_MEASURED_WITH) | {"source", "sockets_busbw_gbps"}
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise fail(f"fabric_gate has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    for key in _GATE_NUMBERS + ("sockets_busbw_gbps",):
        value = item.get(key)
        if key in _GATE_NUMBERS or value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise fail(f"fabric_gate.{key} must be a positive number, got {value!r}")
    if not 0 < item["floor_fraction"] <= 1:
        raise fail(f"fabric_gate.floor_fraction must be in (0, 1], got {item['floor_fraction']!r}")
    if not isinstance(item.get("source"), str) or not item["source"]:
        raise fail("fabric_gate.source must say where the figure comes from")
    for key, choices in _GATE_MEASURED_WITH.items():
        if item.get(key) not in choices:
            raise fail(f"fabric_gate.{key} must say what the figure was measured with, one of "
                       f"{', '.join(choices)}; got {item.get(key)!r}")
    return dict(item)


def _closure(item: object, binds: Sequence[BindSpec], fail) -> Optional[ClosureSpec]:
    if item is None:
        return None
    if not isinstance(item, dict) or set(item) != {"target", "source"}:
        raise fail("'closure' must be {\"target\": \"/container/dir\", \"source\": \"...\"}")
    def field(what: str) -> LaunchError:
        return fail(f"'closure': {what}")

    target = _string(item, "target", field)
    source = _string(item, "source", field)
    searched = {path for spec in binds for path in spec.library_path}
    if target not in searched:
        raise fail(f"'closure' target {target} is on no bind's library_path, so nothing would find the libraries there")
    return ClosureSpec(target, source)


def _string(data: Mapping[str, object], key: str, fail) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise fail(f"'{key}' must be a non-empty string")
    return value


def _list(data: Mapping[str, object], key: str, fail) -> List[object]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise fail(f"'{key}' must be a list")
    return value


def _paths(item: Mapping[str, object], key: str, fail) -> Tuple[str, ...]:
    values = item.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, str) and v.startswith("/") for v in values):
        raise fail(f"bind {item.get('name')!r}: '{key}' must be a list of absolute container paths")
    return tuple(values)


def _bind(item: object, index: int, fail) -> BindSpec:
    if not isinstance(item, dict):
        raise fail(f"binds[{index}] must be an object")
    allowed = {"name", "env", "glob", "target", "required", "library_path", "include_path", "order", "source", "hint"}
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise fail(f"binds[{index}] has unknown key(s) {', '.join(unknown)}")
    def field(what: str) -> LaunchError:
        return fail(f"binds[{index}]: {what}")

    name = _string(item, "name", field)
    target = _string(item, "target", field)
    if not target.startswith("/") or "," in target or ":" in target:
        raise fail(f"bind {name!r}: 'target' must be an absolute path without ',' or ':'")
    if not item.get("env") and not item.get("glob"):
        raise fail(f"bind {name!r} needs 'env' (a module root variable) or 'glob' (host path pattern)")
    module_root = item.get("env")
    if module_root is not None and not isinstance(module_root, str):
        raise fail(f"bind {name!r}: 'env' must be the name of a variable (a string)")
    host_glob = item.get("glob")
    if host_glob is not None and (not isinstance(host_glob, str) or not host_glob.startswith("/")):
        raise fail(f"bind {name!r}: 'glob' must be an absolute host path pattern")
    order = item.get("order", "prepend")
    if order not in LIBRARY_ORDERS:
        raise fail(f"bind {name!r}: 'order' must be one of {', '.join(LIBRARY_ORDERS)}")
    hint = item.get("hint", "")
    if not isinstance(hint, str):
        raise fail(f"bind {name!r}: 'hint' must be a string")
    required = item.get("required", True)
    if not isinstance(required, bool):
        raise fail(f"bind {name!r}: 'required' must be true or false")
    return BindSpec(
        name=name,
        target=target,
        source=_string(item, "source", field),
        env=module_root or None,
        glob=host_glob,
        required=required,
        library_path=_paths(item, "library_path", fail),
        include_path=_paths(item, "include_path", fail),
        order=order,
        hint=hint,
    )


def _env_default(key: str, value: object, fail) -> EnvDefault:
    if not re.match(r"^[A-Z_][A-Z0-9_]*$", key):
        raise fail(f"env name {key!r} is not a valid variable name")
    if not isinstance(value, dict) or set(value) != {"value", "source"}:
        raise fail(f"env {key} must be {{\"value\": \"...\", \"source\": \"...\"}}")
    if not isinstance(value["value"], str) or not isinstance(value["source"], str) or not value["source"]:
        raise fail(f"env {key}: 'value' and 'source' must be strings (source non-empty)")
    return EnvDefault(key, value["value"], value["source"])


def version_key(path: str) -> Tuple[Tuple[int, object], ...]:
    """Natural sort key: 2.3.1 > 1.22.0 > 1.9.0, digits compared as numbers."""
    parts = re.findall(r"\d+|\D+", path)
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


def host_path(root: str, path: str) -> str:
    """path as seen under a probe root ("/" on a real host, a fake tree in tests)."""
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


class ResolvedBind(NamedTuple):
    spec: BindSpec
    host: Optional[str]  # None: optional and not found
    how: str             # why this host path, for the user


def resolve_bind(spec: BindSpec, env: Mapping[str, str], root: str = "/") -> ResolvedBind:
    """The module root if loaded, else the newest glob match; say which."""
    if spec.env and env.get(spec.env):
        candidate = env[spec.env]
        if os.path.exists(host_path(root, candidate)):
            return ResolvedBind(spec, host_path(root, candidate), f"${spec.env} (loaded module)")
        raise LaunchError(
            f"bind {spec.name}: ${spec.env} is {candidate} but that path does not exist; "
            f"reload the module or unset {spec.env}"
        )
    if spec.glob:
        matches = sorted(glob.glob(host_path(root, spec.glob)), key=version_key)
        if matches:
            chosen = matches[-1]
            if len(matches) > 1:
                others = ", ".join(os.path.basename(m.rstrip("/")) for m in matches[:-1])
                how = f"newest match of {spec.glob} (also found: {others})"
            else:
                how = f"only match of {spec.glob}"
            return ResolvedBind(spec, chosen, how)
    if not spec.required:
        return ResolvedBind(spec, None, "not found; optional, skipped")
    looked = " and ".join(
        part for part in (f"${spec.env} is unset" if spec.env else "", f"nothing matches {spec.glob}" if spec.glob else "") if part
    )
    fix = spec.hint or "install it or edit the site profile"
    raise LaunchError(f"bind {spec.name}: no host path found ({looked}); {fix}")


def resolve_binds(profile: SiteProfile, env: Mapping[str, str], root: str = "/") -> Tuple[ResolvedBind, ...]:
    return tuple(resolve_bind(spec, env, root) for spec in profile.binds)


def apptainer_bind_value(binds: Sequence[ResolvedBind], existing: str = "") -> str:
    """APPTAINER_BIND: the user's existing entries first, then ours (src:dst, comma-separated)."""
    entries: List[str] = [e for e in existing.split(",") if e] if existing else []
    for bind in binds:
        if bind.host is None:
            continue
        if "," in bind.host or ":" in bind.host:
            raise LaunchError(f"bind {bind.spec.name}: host path {bind.host} contains ',' or ':', which APPTAINER_BIND cannot carry")
        entries.append(f"{bind.host}:{bind.spec.target}")
    return ",".join(entries)


def container_search_paths(profile: SiteProfile) -> Dict[str, Tuple[str, ...]]:
    """LD_LIBRARY_PATH entries grouped by order, and CPATH entries, as declared."""
    groups: Dict[str, List[str]] = {order: [] for order in LIBRARY_ORDERS}
    includes: List[str] = []
    for spec in profile.binds:
        groups[spec.order].extend(spec.library_path)
        includes.extend(spec.include_path)
    result = {order: tuple(paths) for order, paths in groups.items()}
    result["include"] = tuple(includes)
    return result


# -- the job scripts' question: python3 -m ddp_launch.sites --site SITE srun-args ----------------

PROG = "python3 -m ddp_launch.sites"


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO) -> int:
    """Print the site's srun options for the training step, one word a line (none: nothing)."""
    parser = FlagParser(prog=PROG, subcommand="sites", hint=f"see {PROG} --help",
                        description="Answer a job script's question about the site profile.")
    parser.add_argument("--site", default=env.get("DDP_SITE") or None, required=not env.get("DDP_SITE"),
                        help=f"site profile (default $DDP_SITE); also found in ${SITES_DIR_VAR}")
    parser.add_argument("question", choices=("srun-args",),
                        help="srun-args: the options the training step's srun takes, one a line")
    args = parser.parse_args(list(argv))
    for item in load_site(args.site, env).srun_args:
        print(item.value, file=out)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(lambda args: run(args, os.environ, sys.stdout), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
