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
from typing import Dict, Mapping, NamedTuple, Optional, Sequence, Tuple

from ddp_contract import fabrics
from ddp_contract.data_files import SITE, SITES_DIR_VAR, check_header, find, read_json_file, search_path
from ddp_contract.errors import LaunchError
from ddp_contract.records import (ENV_TABLE, FLAG, LIST, STRING, TEXT, Field, Reader, exactly, is_text, must_be,
                                  object_of, one_of, optional, rule, showing_value)

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
    """One variable a site sets when the user has not, and where the value comes from. A value of None
    (null in the profile) leaves the variable unset where a fabric default would set it: the site
    decides where the public sources disagree, and "the library's own default" is a decision too."""

    name: str
    value: Optional[str]
    source: str


class GateSubgroups(NamedTuple):
    """Whether the fabric gate may build a process group per node and per pair of nodes to name the
    node at fault (src/ddp_train/gate/run.py), and why not where a site forbids it."""

    allowed: bool
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
    gate_subgroups: Optional[GateSubgroups] = None  # None: the gate may build its per-node and per-pair groups

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
    check_header(SITE, data, path)
    reader = Reader(SITE.what, path)
    profile = reader.record(data, _PROFILE)
    binds = tuple(_bind(reader, item, index) for index, item in enumerate(profile.pop("binds")))
    targets = [b.target for b in binds]
    duplicates = sorted({t for t in targets if targets.count(t) > 1})
    if duplicates:
        raise reader.error(f"two binds share the target {duplicates[0]}")
    env = tuple(EnvDefault(name, entry["value"], entry["source"])
                for name, entry in sorted(reader.env_table(profile.pop("env"), null_value=True)))
    return SiteProfile(
        name=data["name"],
        binds=binds,
        env=env,
        path=path,
        closure=_closure(reader, profile.pop("closure"), binds),
        fabric_gate=_fabric_gate(reader, profile.pop("fabric_gate")),
        srun_args=tuple(_srun_arg(reader, item, index) for index, item in enumerate(profile.pop("srun_args"))),
        container_runtime=_container_runtime(reader, profile.pop("container_runtime")),
        gate_subgroups=_gate_subgroups(reader, profile.pop("gate_subgroups")),
        **profile,
    )


def _known_fabric(value: object) -> Optional[str]:
    """One of the fabrics' registry, read at each call (a test may register one), or auto."""
    return one_of(fabrics.FABRICS + (fabrics.AUTO,))(value)


_PROFILE = (
    Field("fabric", (TEXT, _known_fabric)),
    Field("gpu", (must_be("a string or null", lambda value: value is None or isinstance(value, str)),), None),
    Field("accelerator", (one_of(ACCELERATORS),), ACCELERATORS[0]),
    Field("binds", (LIST,), []),
    Field("description", (STRING,), ""),
    Field("env", (ENV_TABLE,), {}),
    Field("closure", (optional(exactly(("target", "source"), '{"target": "/container/dir", "source": "..."}')),),
          None),
    Field("fabric_gate", (), None),  # _fabric_gate
    Field("srun_args", (LIST,), []),
    Field("container_runtime", (optional(exactly(
        ("command", "source"), '{"command": "apptainer" or "singularity", "source": "..."}')),), None),
    Field("gate_subgroups", (optional(exactly(
        ("allowed", "source"), '{"allowed": true or false, "source": "..."}')),), None),
)

# An option the site's steps give srun, one word ("--network=disable_rdzv_get"), with its source.
_SRUN_ARG_SHAPE = exactly(("value", "source"), "an object with exactly 'value' and 'source'")
_SRUN_ARG = (
    Field("value", (showing_value("must be one srun option word starting with '--'", lambda value: isinstance(
        value, str) and value.startswith("--") and not any(c.isspace() for c in value)),)),
    Field("source", (rule("must say where the option comes from", is_text),)),
)
# {"command": "singularity", "source": "..."}: the site's runtime, with where that is said.
_RUNTIME = (
    Field("command", (one_of(CONTAINER_RUNTIMES),)),
    Field("source", (rule("must say where the site's runtime is documented", is_text),)),
)


def _srun_arg(reader: Reader, item: object, index: int) -> SrunArg:
    reader.check(item, (_SRUN_ARG_SHAPE,), f"srun_args[{index}]")
    return SrunArg(**reader.record(item, _SRUN_ARG, f"srun_args[{index}].{{}}"))


def _gate_subgroups(reader: Reader, item: object) -> Optional[GateSubgroups]:
    if item is None:
        return None
    return GateSubgroups(**reader.record(item, (
        Field("allowed", (FLAG,)),
        Field("source", (rule("must say why (where the hang or the rule is documented)", is_text),))),
        "'gate_subgroups'.{}"))


def _container_runtime(reader: Reader, item: object) -> str:
    if item is None:
        return CONTAINER_RUNTIMES[0]
    return reader.record(item, _RUNTIME, "'container_runtime'.{}")["command"]


# The fabric gate's expectation: a published all-reduce bus bandwidth at one size, the share of it
# below which the gate fails, and where the figure comes from (src/ddp_train/gate/judge.py).
_positive_number = showing_value("must be a positive number", lambda value: not isinstance(value, bool) and isinstance(
    value, (int, float)) and value > 0)


# The figure judges only a gate run with the backend and device it was measured with (nccl-tests:
# nccl on cuda, which is RCCL on ROCm's torch); torch.distributed's names.
_MEASURED_WITH = "must say what the figure was measured with, one of {choices}; got {value!r}"
_GATE = (
    Field("size_bytes", (_positive_number,)),
    Field("busbw_gbps", (_positive_number,)),
    Field("floor_fraction", (_positive_number, showing_value("must be in (0, 1]", lambda value: value <= 1))),
    Field("sockets_busbw_gbps", (optional(_positive_number),), None),
    Field("source", (rule("must say where the figure comes from", is_text),)),
    Field("backend", (one_of(("nccl", "gloo"), _MEASURED_WITH),)),
    Field("device", (one_of(("cuda", "cpu"), _MEASURED_WITH),)),
)


def _fabric_gate(reader: Reader, item: object) -> Optional[Dict[str, object]]:
    if item is None:
        return None
    shape = "an object with size_bytes, busbw_gbps, floor_fraction, source, backend and device"
    reader.check(item, (object_of(shape),), "'fabric_gate'")
    reader.known_keys(item, _GATE, "fabric_gate")
    reader.record(item, _GATE, "fabric_gate.{}")
    return dict(item)


def _closure(reader: Reader, item: object, binds: Sequence[BindSpec]) -> Optional[ClosureSpec]:
    if item is None:
        return None
    closure = ClosureSpec(**reader.record(item, (Field("target", (TEXT,)), Field("source", (TEXT,))),
                                          "'closure': '{}'"))
    searched = {path for spec in binds for path in spec.library_path}
    if closure.target not in searched:
        raise reader.error(f"'closure' target {closure.target} is on no bind's library_path, so nothing would find "
                           f"the libraries there")
    return closure


_PATHS = must_be("a list of absolute container paths", lambda value: isinstance(value, list) and all(
    isinstance(v, str) and v.startswith("/") for v in value))
# A bind's fields: those named by the bind's place until its name is read, then by its name.
_BIND_TEXTS = (Field("name", (TEXT,)), Field("target", (TEXT,)), Field("source", (TEXT,)))
_BIND = (
    Field("target", (must_be("an absolute path without ',' or ':'",
                             lambda value: value.startswith("/") and "," not in value and ":" not in value),)),
    Field("env", (optional(must_be("the name of a variable (a string)", lambda value: isinstance(value, str))),), None,
          lambda value: value or None),
    Field("glob", (optional(must_be("an absolute host path pattern",
                                    lambda value: isinstance(value, str) and value.startswith("/"))),), None),
    Field("order", (one_of(LIBRARY_ORDERS),), "prepend"),
    Field("hint", (STRING,), ""),
    Field("required", (FLAG,), True),
    Field("library_path", (_PATHS,), [], tuple),
    Field("include_path", (_PATHS,), [], tuple),
)


def _bind(reader: Reader, item: object, index: int) -> BindSpec:
    where = f"binds[{index}]"
    reader.check(item, (object_of("an object"),), where)
    reader.known_keys(item, _BIND_TEXTS + _BIND, where)
    texts = reader.record(item, _BIND_TEXTS, where + ": '{}'")
    named = f"bind {texts['name']!r}"
    if not item.get("env") and not item.get("glob"):
        raise reader.error(f"{named} needs 'env' (a module root variable) or 'glob' (host path pattern)")
    return BindSpec(**{**texts, **reader.record(item, _BIND, named + ": '{}'")})
