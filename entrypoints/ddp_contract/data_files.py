"""The JSON data files (site profiles, fabric defaults, GPU vendors): where they are found, and
the checks every one of them passes before its own parser reads it.

One search path: $DDP_SITES_DIR, else beside the package (the repo's containers/sites, the
image's /opt/ddp/sites); fabric defaults and vendor data are also looked for in the built-in
places, so a DDP_SITES_DIR of one's own profiles still gets the shipped ones. One header check:
a JSON object, no key the kind does not know, "schema": 1, "name" the file's own. Each problem
is one line naming the file and the fix. Python 3.6, standard library (host-modules.txt): the
job scripts read profiles with the node's python3, and the trainer reads them too.
"""

import json
import os
from typing import FrozenSet, Mapping, NamedTuple, Optional, Sequence, Tuple

from ddp_contract.errors import LaunchError

SITES_DIR_VAR = "DDP_SITES_DIR"


class Kind(NamedTuple):
    """One kind of data file."""

    what: str                   # how messages name one: "site profile"
    directory: str              # below each sites directory: "" for the profiles themselves
    keys: FrozenSet[str]        # the top-level keys a file may have besides "schema" and "name"
    builtin_too: bool           # searched in the built-in places after $DDP_SITES_DIR
    restore: str                # the fix when a file of this kind is missing


SITE = Kind("site profile", "", frozenset({
    "description", "fabric", "accelerator", "gpu", "binds", "env", "closure", "fabric_gate", "srun_args",
    "container_runtime", "gate_subgroups"}), False, "")
FABRIC = Kind("fabric defaults", "fabrics", frozenset({"description", "env", "host_libraries"}), True,
              "restore containers/sites/fabrics from the repository (the image copies it to /opt/ddp/sites)")
ACCELERATOR = Kind("accelerator data", "accelerators", frozenset({
    "description", "runtime", "visible_devices", "device_files", "driver", "apptainer", "kubernetes",
    "collective", "sampler", "health"}), True, "restore containers/sites/accelerators from the repository")


def sites_dirs(env: Mapping[str, str]) -> Tuple[str, ...]:
    """Where profiles live: $DDP_SITES_DIR, else next to the package (repo or image layout)."""
    if env.get(SITES_DIR_VAR):
        return (env[SITES_DIR_VAR],)
    package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = os.path.dirname(package_parent)
    # Repo: <repo>/entrypoints/ddp_contract -> <repo>/containers/sites.
    # Image: /opt/ddp/python/ddp_contract -> /opt/ddp/sites.
    return (os.path.join(base, "containers", "sites"), os.path.join(base, "sites"))


def search_path(kind: Kind, env: Mapping[str, str]) -> Tuple[str, ...]:
    """The directories a file of kind is looked for in, in order."""
    if not kind.builtin_too:
        return sites_dirs(env)
    ordered = []
    for directory in sites_dirs(env) + sites_dirs({}):
        path = os.path.join(directory, kind.directory)
        if path not in ordered:
            ordered.append(path)
    return tuple(ordered)


def find(name: str, directories: Sequence[str]) -> Optional[str]:
    """The path of the first <name>.json in directories (a kind's search_path), or None."""
    for directory in directories:
        path = os.path.join(directory, name + ".json")
        if os.path.isfile(path):
            return path
    return None


def find_or_fail(kind: Kind, name: str, directories: Sequence[str]) -> str:
    """find(), or the one line that says where it looked and how to restore the file."""
    path = find(name, directories)
    if path is None:
        raise LaunchError("{} {}/{}.json not found (searched {}); {}".format(
            kind.what, kind.directory, name, ", ".join(directories), kind.restore))
    return path


def read_json_file(path: str, what: str) -> object:
    """A JSON document; one line naming the file when it is bad."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError) as exc:
        raise LaunchError(f"{what} {path} cannot be read: {exc}; fix the file") from None


def read_document(kind: Kind, path: str) -> dict:
    """The file at path, read and checked as kind (check_header)."""
    data = read_json_file(path, kind.what)
    check_header(kind, data, path)
    return data


def check_header(kind: Kind, data: object, path: str) -> None:
    """What every data file has: a JSON object of known keys, "schema": 1, "name" the file's own."""

    def fail(what: str) -> LaunchError:
        return LaunchError(f"bad {kind.what} {path}: {what}")

    if not isinstance(data, dict):
        raise fail("the top level must be a JSON object")
    allowed = kind.keys | {"schema", "name"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise fail(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    if type(data.get("schema")) is not int or data.get("schema") != 1:  # not true, not 1.0
        raise fail(f"'schema' must be 1, got {data.get('schema')!r}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise fail("'name' must be a non-empty string")
    expected = os.path.basename(path)[:-len(".json")] if path.endswith(".json") else name
    if name != expected:
        raise fail(f"'name' is {name!r} but the file is named {expected}.json")
