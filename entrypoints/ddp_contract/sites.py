"""Site profiles: what a cluster needs (host library binds, environment), read from data.

Read by the launcher (binds, the fabric plan), the job scripts on the HOST (SLES 15's python3 is
3.6) and the trainer's fabric gate (its expected bus bandwidth), so it lives in the contract and
uses only the standard library and Python 3.6 syntax (`make lint` checks it with vermin).
Profiles are JSON (tomllib is 3.11+), found and header-checked by ddp_contract.data_files; every
value carries its source so --dry-run can cite it. Resolving the binds on a node is the
launcher's (ddp_launch.sites).
"""

import os
import re
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ddp_contract import fabrics
from ddp_contract.data_files import SITE, SITES_DIR_VAR, check_header, find, read_json_file, search_path
from ddp_contract.errors import LaunchError

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


def available_sites(env: Mapping[str, str]) -> Tuple[str, ...]:
    names = set()
    for directory in search_path(SITE, env):
        if os.path.isdir(directory):
            names.update(n[:-5] for n in os.listdir(directory) if n.endswith(".json"))
    return tuple(sorted(names))


def load_site(name: str, env: Mapping[str, str]) -> SiteProfile:
    """Find and validate the profile called name; LaunchError names the problem."""
    if not _NAME_PATTERN.match(name):
        raise LaunchError(f"site name {name!r} is not valid; use lower-case letters, digits, '-' or '_'")
    path = find(name, search_path(SITE, env))
    if path is not None:
        return read_profile(path)
    known = ", ".join(available_sites(env)) or "none found"
    searched = ", ".join(search_path(SITE, env))
    raise LaunchError(
        f"unknown site {name!r} (known: {known}; searched {searched}); "
        f"pass --site with one of those or set {SITES_DIR_VAR}"
    )


def read_profile(path: str) -> SiteProfile:
    return parse_profile(read_json_file(path, SITE.what), path)


def parse_profile(data: object, path: str) -> SiteProfile:
    """Validate the JSON document; every problem names the file and the key."""

    def fail(what: str) -> LaunchError:
        return LaunchError(f"bad site profile {path}: {what}")

    check_header(SITE, data, path)
    name = data["name"]
    fabric = _string(data, "fabric", fail)
    known = fabrics.FABRICS + (fabrics.AUTO,)  # read here, not at import: the names are the fabrics' registry
    if fabric not in known:
        raise fail(f"'fabric' must be one of {', '.join(known)}, got {fabric!r}")
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
# below which the gate fails, and where the figure comes from (src/ddp_train/gate/judge.py).
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
