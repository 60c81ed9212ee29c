"""The GPU vendor as data: containers/sites/accelerators/<name>.json (nvidia, amd), picked by the site profile.

What differs between vendors (visible-device variables, device files, the driver probe, Apptainer's
flag, the sampler command, the collective library and its net plugin, the GPU health command and
which of its fields mean a sick GPU) is read here once, at the edge, into an Accelerator; the launcher, doctor and the job scripts ask it instead of naming a
vendor. Runs on the HOST too (job scripts: `python3 -m ddp_launch.accelerators --site SITE
apptainer-flag`), so standard library and Python 3.6 only (vermin checks it).
"""

import argparse
import os
import re
import sys
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, TextIO, Tuple

from ddp_contract.data_files import ACCELERATOR, check_header, find_or_fail, read_json_file, search_path
from ddp_contract.records import (FLAG, OBJECTS, POSITIVE_INTEGER, TEXT, WORDS, Field, Reader, object_of, one_of,
                                  regular_expression, rule, when_given)
from ddp_launch.errors import LaunchError, run_main
from ddp_launch.flags import FlagParser
from ddp_launch.sites import ACCELERATORS, SITES_DIR_VAR, load_site

ACCELERATORS_DIRNAME = ACCELERATOR.directory
DEFAULT_ACCELERATOR = ACCELERATORS[0]  # no site profile, or one without "accelerator"
INTERVAL_PLACEHOLDER = "{interval}"
PROG = "python3 -m ddp_launch.accelerators"
# What gpumon reads from a sampler CSV; each vendor's file names its column for each.
SAMPLER_COLUMNS = ("timestamp", "index", "name", "utilization", "memory_used")
_SECTIONS = ("visible_devices", "device_files", "driver", "apptainer", "kubernetes", "collective", "sampler",
             "health")  # each one of ACCELERATOR.keys
# How the doctor reads a health command's output (ddp_launch.doctor.gpu_health has a reader for each).
HEALTH_FORMATS = ("nvidia-smi-xml", "amd-smi-json")
# When a health field means a sick GPU: a count over zero, "Yes", "Active", or a non-empty list
# (of pages); anything else, "N/A" and a missing field included, is not a failure.
FAILS_WHEN = ("above_zero", "yes", "active", "entries")
# When a temperature is over its slowdown limit: an absolute reading at or above it, or a
# headroom (NVIDIA's T.Limit temperatures) at or below it.
SLOW_WHEN = ("at_or_above", "at_or_below")
# What a health rule's finding is: a fault stays until a reset or a repair (an ECC count, a pending
# remap), so one reading fails the node; a state may pass within seconds (a clock slowdown, a
# temperature at its limit), so the doctor reads again and fails only what holds in both.
RULE_KINDS = ("fault", "state")
# The placeholders a health.tool_missing_fix may hold: the command that runs the image, and its
# environment prefix (APPTAINERENV_, SINGULARITYENV_: Apptainer's "Environment and Metadata").
FIX_PLACEHOLDERS = {"runtime": "apptainer", "runtime_env": "APPTAINERENV_"}


class Sampler(NamedTuple):
    command: Tuple[str, ...]        # the words; INTERVAL_PLACEHOLDER stands for the period in seconds
    repeats: bool                   # the command samples every interval itself (else the sampler loops)
    columns: Dict[str, str]         # SAMPLER_COLUMNS -> the CSV header's column
    memory_unit_bytes: int          # the memory_used column's unit
    source: str

    def words(self, interval: str) -> Tuple[str, ...]:
        return tuple(word.replace(INTERVAL_PLACEHOLDER, interval) for word in self.command)


class HealthCommand(NamedTuple):
    argv: Tuple[str, ...]
    required: bool                  # its failure means the GPUs cannot be read; else only a note


class HealthSignal(NamedTuple):
    path: str                       # where in one GPU's record ("ecc_errors/volatile/dram_uncorrectable")
    fails_when: str                 # one of FAILS_WHEN


class HealthRule(NamedTuple):
    name: str                       # "uncorrectable ECC errors": what the doctor's message calls it
    signals: Tuple[HealthSignal, ...]
    source: str
    kind: str                       # one of RULE_KINDS


class TemperatureLimit(NamedTuple):
    current: str                    # the reading's path
    limit: str                      # the GPU's own slowdown limit, in the same record
    slow_when: str                  # one of SLOW_WHEN


class Health(NamedTuple):
    """How the doctor reads this vendor's GPU health (ddp_launch.doctor.gpu_health decides on it)."""

    commands: Tuple[HealthCommand, ...]
    format: str                     # one of HEALTH_FORMATS
    partitions: Optional[str]       # a GPU's parts the scheduler grants one by one (MIG devices)
    rules: Tuple[HealthRule, ...]
    temperatures: Tuple[TemperatureLimit, ...]     # a state: the GPU cools down or it does not
    temperature_source: str
    tool_missing_fix: str           # what to do when the tool is not on the container's PATH (FIX_PLACEHOLDERS)
    source: str

    def missing_tool_fix(self, runtime: str) -> str:
        return self.tool_missing_fix.format(runtime=runtime, runtime_env=runtime.upper() + "ENV_")


class Accelerator(NamedTuple):
    """One GPU vendor's words, each group with the source it comes from."""

    name: str                           # nvidia | amd
    runtime: str                        # CUDA | HIP: what "cannot use any GPU" messages name
    visible_variables: Tuple[str, ...]  # the runtime's visible-device variables, the one it obeys first
    device_directory: str               # where the per-GPU device files are (/dev, /dev/dri)
    device_pattern: str                 # their names (a regular expression, matched whole)
    device_label: str                   # how messages name them (/dev/nvidia[0-9]*)
    driver_library: str                 # dlopened by the driver probe
    driver_init: str                    # its init(0) symbol
    driver_count: str                   # its count(int*) symbol
    driver_errors: Dict[int, str]       # the init/count status codes worth naming
    driver_version_file: str            # where doctor reads the kernel driver's version
    driver_minimum: Dict[int, int]      # runtime major -> oldest driver major, where published (CUDA)
    driver_too_old_fix: Optional[str]   # what to do when the driver is older than that
    apptainer_flag: str                 # --nv | --rocm
    kubernetes_resource: str            # nvidia.com/gpu | amd.com/gpu
    device_plugin: str                  # who hands that resource to pods
    collective: str                     # NCCL | RCCL
    collective_library: str             # libnccl.so.2 | librccl.so.1
    net_plugin: str                     # the net plugin file the collective dlopens
    ofi_plugin: str                     # the libfabric plugin's project
    plugin_dlopens: Optional[str]       # an unversioned runtime library that plugin builds dlopen (libcudart.so)
    plugin_dlopens_dirs: Tuple[str, ...]  # where the runtime installs it, besides ld.so's search (/usr/local/cuda/lib64)
    sampler: Sampler
    health: Health                      # the GPU health command and the fields that fail a node
    sources: Dict[str, str]             # section -> source
    path: str

    def is_device_file(self, name: str) -> bool:
        return re.fullmatch(self.device_pattern, name) is not None


def accelerator_dirs(env: Mapping[str, str]) -> Tuple[str, ...]:
    """Beside the site profiles ($DDP_SITES_DIR, the repo, the image), then the built-in places."""
    return search_path(ACCELERATOR, env)


def load_accelerator(name: str, env: Mapping[str, str]) -> Accelerator:
    if name not in ACCELERATORS:
        raise LaunchError(f"accelerator {name!r} is not known; use one of {', '.join(ACCELERATORS)}")
    path = find_or_fail(ACCELERATOR, name, accelerator_dirs(env))
    return parse_accelerator(read_json_file(path, ACCELERATOR.what), path)


def site_accelerator(site: Optional[str], env: Mapping[str, str]) -> Accelerator:
    """The vendor the site profile names (no site, or a profile without one: nvidia)."""
    name = load_site(site, env).accelerator if site else DEFAULT_ACCELERATOR
    return load_accelerator(name, env)


def parse_accelerator(data: object, path: str) -> Accelerator:
    """Validate the JSON document; every problem names the file and the key."""
    check_header(ACCELERATOR, data, path)
    reader = Reader(ACCELERATOR.what, path)
    runtime = reader.value(data, Field("runtime", (TEXT,)))
    sections = {key: reader.value(data, Field(key, (object_of("an object (with a 'source')"),))) for key in _SECTIONS}
    values: Dict[str, object] = {}
    for section, fields in _VALUES:
        values.update(reader.record(sections[section], fields, "'" + section + ".{}'"))
    sampler = reader.record(sections["sampler"], _SAMPLER, "'sampler.{}'")
    if sampler["repeats"] and not any(INTERVAL_PLACEHOLDER in word for word in sampler["command"]):
        raise reader.error(f"'sampler.command' repeats by itself, so one word must hold {INTERVAL_PLACEHOLDER}")
    sources = {key: reader.value(sections[key], _SOURCE, "'" + key + ".{}'") for key in _SECTIONS}
    return Accelerator(name=data["name"], runtime=runtime, sampler=Sampler(**sampler),
                       health=_health(reader, sections["health"]), sources=sources, path=path, **values)


_SOURCE = Field("source", (TEXT,))
_NUMBERED = rule("must map status codes (\"100\") to names", lambda value: isinstance(value, dict) and all(
    k.isdigit() and isinstance(v, str) for k, v in value.items()))
_MAJORS = rule("must map runtime majors (\"12\") to driver majors (525)", lambda value: isinstance(
    value, dict) and all(k.isdigit() and type(v) is int for k, v in value.items()))
_NAMES = rule("must be a list of non-empty strings when given", lambda value: isinstance(value, list) and all(
    isinstance(v, str) and v for v in value))


def _by_number(table: Mapping[str, object]) -> Dict[int, object]:
    return {int(key): value for key, value in table.items()}


# Each section's values, as Accelerator names them. Three optional ones are named without their
# section in messages, as they always were.
_VALUES = (
    ("visible_devices", (Field("variables", (WORDS,), convert=tuple, attribute="visible_variables"),)),
    ("device_files", (Field("directory", (TEXT,), attribute="device_directory"),
                      Field("pattern", (TEXT, regular_expression), attribute="device_pattern"),
                      Field("label", (TEXT,), attribute="device_label"))),
    ("driver", (Field("library", (TEXT,), attribute="driver_library"),
                Field("init", (TEXT,), attribute="driver_init"),
                Field("count", (TEXT,), attribute="driver_count"),
                Field("errors", (_NUMBERED,), {}, _by_number, "driver_errors"),
                Field("version_file", (TEXT,), attribute="driver_version_file"),
                Field("minimum_for_runtime_major", (_MAJORS,), {}, _by_number, "driver_minimum"),
                Field("too_old_fix", (when_given(TEXT),), None, attribute="driver_too_old_fix",
                      label="'too_old_fix'"))),
    ("apptainer", (Field("flag", (TEXT,), attribute="apptainer_flag"),)),
    ("kubernetes", (Field("resource", (TEXT,), attribute="kubernetes_resource"),
                    Field("device_plugin", (TEXT,)))),
    ("collective", (Field("name", (TEXT,), attribute="collective"),
                    Field("library", (TEXT,), attribute="collective_library"),
                    Field("net_plugin", (TEXT,)),
                    Field("ofi_plugin", (TEXT,)),
                    Field("plugin_dlopens", (when_given(TEXT),), None, label="'plugin_dlopens'"),
                    Field("plugin_dlopens_dirs", (_NAMES,), [], tuple, label="'plugin_dlopens_dirs'"))),
)
_SAMPLER = (
    Field("command", (WORDS,), convert=tuple),
    Field("repeats", (FLAG,)),
    Field("columns", (rule(f"must name a column for each of {', '.join(SAMPLER_COLUMNS)}",
                           lambda value: isinstance(value, dict) and set(value) == set(SAMPLER_COLUMNS)
                           and all(isinstance(v, str) and v for v in value.values())),), convert=dict),
    Field("memory_unit_bytes", (POSITIVE_INTEGER,)),
    _SOURCE,
)


def _fills(text: str) -> bool:
    try:
        text.format(**FIX_PLACEHOLDERS)
    except (KeyError, IndexError, ValueError):
        return False
    return True


_HEALTH = (
    Field("format", (one_of(HEALTH_FORMATS),)),
    Field("partitions", (when_given(TEXT),), None, label="'partitions'"),
    Field("tool_missing_fix", (TEXT, rule("may hold only {{{}}}".format("}, {".join(FIX_PLACEHOLDERS)), _fills))),
    _SOURCE,
)
_COMMANDS = Field("commands", (OBJECTS,))
_COMMAND = (Field("argv", (WORDS,), convert=tuple), Field("required", (FLAG,)))
_RULES = Field("rules", (rule("must map each rule's name to its signals and source",
                              lambda value: isinstance(value, dict) and bool(value)),))
_RULE = (_SOURCE, Field("kind", (one_of(RULE_KINDS),)))
_SIGNALS = Field("signals", (OBJECTS,))
_SIGNAL = (Field("path", (TEXT,)), Field("fails_when", (one_of(FAILS_WHEN),)))
_TEMPERATURE = Field("temperature", (object_of("an object with 'limits' and 'source'"),))
_LIMITS = Field("limits", (OBJECTS,))
_LIMIT = (Field("current", (TEXT,)), Field("limit", (TEXT,)), Field("slow_when", (one_of(SLOW_WHEN),)))


def _health(reader: Reader, section: Mapping[str, object]) -> Health:
    commands = tuple(HealthCommand(**reader.record(command, _COMMAND, f"'health.commands[{index}].{{}}'"))
                     for index, command in enumerate(reader.value(section, _COMMANDS, "'health.{}'")))
    if not commands[0].required:
        raise reader.error("'health.commands[0]' must be required: it is the one that lists the GPUs")
    rules = tuple(_health_rule(reader, name, found)
                  for name, found in reader.value(section, _RULES, "'health.{}'").items())
    temperature = reader.value(section, _TEMPERATURE, "'health.{}'")
    limits = tuple(TemperatureLimit(**reader.record(limit, _LIMIT, "'health.temperature.limits[].{}'"))
                   for limit in reader.value(temperature, _LIMITS, "'health.temperature.{}'"))
    return Health(commands=commands, rules=rules, temperatures=limits,
                  temperature_source=reader.value(temperature, _SOURCE, "'health.temperature.{}'"),
                  **reader.record(section, _HEALTH, "'health.{}'"))


def _health_rule(reader: Reader, name: str, found: object) -> HealthRule:
    where = f"'health.rules.{name}"
    reader.check(found, (object_of("an object with 'signals' and 'source'"),), where + "'")
    signals = tuple(HealthSignal(**reader.record(signal, _SIGNAL, where + ".signals[].{}'"))
                    for signal in reader.value(found, _SIGNALS, where + ".{}'"))
    return HealthRule(name=name, signals=signals, **reader.record(found, _RULE, where + ".{}'"))


# -- the job scripts' questions: python3 -m ddp_launch.accelerators --site SITE QUESTION ------

QUESTIONS = {
    "apptainer-flag": "Apptainer's GPU flag (--nv, --rocm)",
    "sampler": "the sampler command's words, one a line (--interval fills in the period)",
    "sampler-repeats": "1 when the sampler command repeats by itself, 0 when the caller must loop",
    "name": "the vendor's name (nvidia, amd)",
}


def answer(accelerator: Accelerator, question: str, interval: str) -> Sequence[str]:
    if question == "apptainer-flag":
        return (accelerator.apptainer_flag,)
    if question == "sampler":
        return accelerator.sampler.words(interval)
    if question == "sampler-repeats":
        return ("1" if accelerator.sampler.repeats else "0",)
    return (accelerator.name,)


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO) -> int:
    parser = FlagParser(
        prog=PROG, subcommand="accelerators", hint=f"see {PROG} --help",
        description="Answer a job script's question about the site's GPU vendor.",
        epilog="\n".join(f"  {name:16} {what}" for name, what in QUESTIONS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", default=env.get("DDP_SITE") or None,
                        help=f"site profile (default $DDP_SITE; none: nvidia); also found in ${SITES_DIR_VAR}")
    parser.add_argument("--interval", default=INTERVAL_PLACEHOLDER, help="the sampling period in seconds")
    parser.add_argument("question", choices=sorted(QUESTIONS))
    args = parser.parse_args(list(argv))
    for word in answer(site_accelerator(args.site, env), args.question, args.interval):
        print(word, file=out)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(lambda args: run(args, os.environ, sys.stdout), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
