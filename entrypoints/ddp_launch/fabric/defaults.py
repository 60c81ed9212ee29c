"""Fabric defaults as data: containers/sites/fabrics/<name>.json, every value with its source.

Found and header-checked by ddp_contract.data_files (beside the site profiles, then in the
built-in places, so a DDP_SITES_DIR of one's own profiles still gets the shipped fabric defaults).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ddp_contract.data_files import FABRIC, check_header, find_or_fail, read_json_file, search_path
from ddp_contract.records import ENV_TABLE, FLAG, LIST, STRING, TEXT, Field, Reader, one_of, regular_expression
from ddp_launch.accelerators import DEFAULT_ACCELERATOR, Accelerator, load_accelerator
from ddp_launch.errors import LaunchError
from ddp_launch.fabric import registry
from ddp_launch.sites import SiteProfile, load_site

FABRICS_DIRNAME = FABRIC.directory
COMMON = "common"   # every fabric's, Ethernet's too, applied after the fabric's own
# What a value's "when" may name; plan_fabric works out each one for the job and node.
CONDITIONS = (
    "multi_node",   # more than one node in the job step
    "roce",         # a RoCE device with an IPv4 RoCE v2 GID was found
    "rdzv_get_disabled",  # the step runs with srun --network=disable_rdzv_get (rdzv_get_disabled)
    "kdreg2_default",     # the libfabric the workers load defaults to kdreg2 and /dev/kdreg2 exists
                          # (ddp_launch/mr_monitor.py)
)
# A named condition may be negated, "!kdreg2_default": the value holds where the condition does not.
NOT = "!"
# srun's --network as the step's tasks see it: srun reads SLURM_NETWORK as --network (srun(1), INPUT
# ENVIRONMENT VARIABLES: "SLURM_NETWORK  Same as --network"), and slurm/lib/ddp.sh puts the site
# profile's --network into the step's environment under that name, where the tasks inherit it.
SRUN_NETWORK_VAR = "SLURM_NETWORK"
DISABLE_RDZV_GET = "disable_rdzv_get"


def rdzv_get_disabled(env: Mapping[str, str]) -> bool:
    """Whether the step has srun --network=disable_rdzv_get, the condition of FI_CXI_RDZV_PROTO=alt_read:
    "To use an alternate protocol, the CXI driver property rdzv_get_en should be set to 0" (libfabric's
    fi_cxi(7), FI_CXI_RDZV_PROTO, https://ofiwg.github.io/libfabric/main/man/fi_cxi.7.html), and "When
    running with slurm, the flag --network=disable_rdzv_get is required and must be added to the srun
    command" (HPE's ccl_env.sh, HewlettPackard/shs-ccl-docs). The value is a comma-separated list."""
    return DISABLE_RDZV_GET in (word.strip() for word in env.get(SRUN_NETWORK_VAR, "").split(","))
# A "when" may also compare a fact with a value, KEY=VALUE, and join terms with spaces (all must
# hold): "gpu=gh200 machine=aarch64". The hardware a fix is for is data, not a name in code.
FACTS = (
    "gpu",          # the site profile's gpu model (gh200, a100, mi250x)
    "accelerator",  # the site profile's GPU vendor (nvidia, amd)
    "machine",      # this node's architecture (os.uname().machine: aarch64, x86_64)
)


def when_holds(when: str | None, conditions: Mapping[str, object]) -> bool:
    """Every term of when holds: a named condition is true (false, with "!"), a KEY=VALUE fact equals VALUE."""
    if when is None:
        return True
    for term in when.split():
        key, equals, value = term.partition("=")
        if equals:
            holds = conditions.get(key) == value
        else:
            holds = bool(conditions[key.removeprefix(NOT)]) != key.startswith(NOT)
        if not holds:
            return False
    return True


def when_problem(when: object) -> str | None:
    """Why when is not a valid condition, or None."""
    if not isinstance(when, str) or not when.split():
        return "must be a string"
    for term in when.split():
        key, equals, value = term.partition("=")
        if equals and (key not in FACTS or not value):
            return f"compares {term!r}: use KEY=VALUE with KEY one of {', '.join(FACTS)}"
        if not equals and term.removeprefix(NOT) not in CONDITIONS:
            return (f"names {term!r}: use one of {', '.join(CONDITIONS)} (each may be negated with {NOT}) or "
                    f"KEY=VALUE ({', '.join(FACTS)})")
    return None
LIBRARY_KINDS = ("plain", "libfabric", "nccl")   # how doctor reads the loaded library's version


@dataclass(frozen=True)
class FabricDefault:
    """One variable a fabric sets when nothing else did, only when its condition holds."""

    name: str
    value: str
    source: str
    when: str | None = None


@dataclass(frozen=True)
class HostLibrary:
    """A host library doctor looks for on the workers' LD_LIBRARY_PATH and loads."""

    label: str
    file: str           # regular expression for the file name
    kind: str           # one of LIBRARY_KINDS
    required: bool      # missing in a multi-node job: FAIL (else WARN)
    fix: str
    source: str


@dataclass(frozen=True)
class FabricDefaults:
    name: str
    description: str
    env: tuple[FabricDefault, ...]
    host_libraries: tuple[HostLibrary, ...]
    path: str

    def applicable(self, conditions: Mapping[str, object]) -> tuple[FabricDefault, ...]:
        """The values whose condition holds, in the order the file lists them."""
        return tuple(item for item in self.env if when_holds(item.when, conditions))


# What a host library's label, file, fix and source may name, filled in from the site's GPU vendor
# (accelerators.py): one slingshot.json serves NCCL with aws-ofi-nccl and RCCL with aws-ofi-rccl.
_VENDOR_WORDS = ("collective", "collective_library", "net_plugin", "ofi_plugin")


def for_accelerator(library: HostLibrary, accelerator: Accelerator) -> HostLibrary:
    """library with {collective}, {collective_library}, {net_plugin} and {ofi_plugin} filled in
    (escaped in the file name, a regular expression)."""
    words = {key: getattr(accelerator, key) for key in _VENDOR_WORDS}
    escaped = {key: re.escape(value) for key, value in words.items()}
    return replace(library, label=library.label.format(**words), file=library.file.format(**escaped),
                   fix=library.fix.format(**words), source=library.source.format(**words))


def fabric_dirs(env: Mapping[str, str]) -> tuple[str, ...]:
    return search_path(FABRIC, env)


def load_fabric_defaults(name: str, env: Mapping[str, str]) -> FabricDefaults:
    return read_fabric_defaults(find_or_fail(FABRIC, name, fabric_dirs(env)))


@dataclass(frozen=True)
class FabricData:
    """What plan_fabric reads besides the node: the site profile (None: no --site) and the fabric
    defaults by name, read once at the edge (cli, doctor) by read_fabric_data.

    A file that could not be read is held as its error and raised by site_profile() and
    fabric_defaults() when the plan asks for it: in its turn, after the scheduler's errors,
    and only when the plan needs that file (a broken slingshot.json never stops an Ethernet job).
    """

    profile: SiteProfile | LaunchError | None = None
    defaults: Mapping[str, FabricDefaults | LaunchError] = field(default_factory=dict)
    # The GPU vendor the profile names (nvidia without one); None: not read (a plan of the fabric alone).
    accelerator: Accelerator | None = None

    def site_profile(self) -> SiteProfile | None:
        if isinstance(self.profile, LaunchError):
            raise self.profile
        return self.profile

    def fabric_defaults(self, name: str) -> FabricDefaults:
        found = self.defaults.get(name) or LaunchError(f"fabric defaults {FABRICS_DIRNAME}/{name}.json not read")
        if isinstance(found, LaunchError):
            raise found
        return found


def read_fabric_data(site: str | None, env: Mapping[str, str]) -> FabricData:
    """The edge: read the site profile called site (--site / DDP_LAUNCH_SITE), its GPU vendor's data
    and every fabric's defaults. The vendor's data must be readable: every launch needs it."""
    profile: SiteProfile | LaunchError | None = None
    if site:
        try:
            profile = load_site(site, env)
        except LaunchError as error:
            profile = error
    vendor = profile.accelerator if isinstance(profile, SiteProfile) else DEFAULT_ACCELERATOR
    return FabricData(profile, read_all_fabric_defaults(env), load_accelerator(vendor, env))


def fabric_files() -> tuple[str, ...]:
    """The files plan_fabric may need: each fabric's own (Ethernet has none), then common.json for every fabric."""
    return tuple(fabric.NAME for fabric in registry.registered() if fabric.HAS_DEFAULTS) + (COMMON,)


def read_all_fabric_defaults(env: Mapping[str, str]) -> dict[str, FabricDefaults | LaunchError]:
    """The edge: each of fabric_files(), or the error that says why it cannot be read."""
    defaults: dict[str, FabricDefaults | LaunchError] = {}
    for name in fabric_files():
        try:
            defaults[name] = load_fabric_defaults(name, env)
        except LaunchError as error:
            defaults[name] = error
    return defaults


def read_fabric_defaults(path: str) -> FabricDefaults:
    return parse_fabric_defaults(read_json_file(path, FABRIC.what), path)


def parse_fabric_defaults(data: object, path: str) -> FabricDefaults:
    """Validate the JSON document; every problem names the file and the key."""
    check_header(FABRIC, data, path)
    reader = Reader(FABRIC.what, path)
    found = reader.record(data, _DEFAULTS)
    env = []
    for name, entry in reader.env_table(found["env"], optional_keys=("when",)):
        problem = when_problem(entry["when"]) if entry.get("when") is not None else None
        if problem:
            raise reader.error(f"env {name}: 'when' {problem}, got {entry['when']!r}")
        env.append(FabricDefault(name, entry["value"], entry["source"], entry.get("when")))
    return FabricDefaults(name=data["name"], description=found["description"], env=tuple(env),
                          host_libraries=tuple(_library(reader, index, item)
                                               for index, item in enumerate(found["host_libraries"])),
                          path=path)


_DEFAULTS = (
    Field("description", (STRING,), ""),
    Field("env", (ENV_TABLE,), {}),
    Field("host_libraries", (LIST,), []),
)
_LIBRARY = (
    Field("label", (TEXT,)), Field("file", (TEXT, regular_expression)), Field("kind", (one_of(LIBRARY_KINDS),)),
    Field("required", (FLAG,)), Field("fix", (TEXT,)), Field("source", (TEXT,)),
)


def _library(reader: Reader, index: int, item: object) -> HostLibrary:
    keys = {field.key for field in _LIBRARY}
    if not isinstance(item, dict) or set(item) != keys:
        raise reader.error(f"host_libraries[{index}] must have exactly the keys {', '.join(sorted(keys))}")
    return HostLibrary(**reader.record(item, _LIBRARY, f"host_libraries[{index}]: '{{}}'"))
