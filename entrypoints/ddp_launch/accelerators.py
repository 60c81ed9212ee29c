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

    def fail(what: str) -> LaunchError:
        return LaunchError(f"bad accelerator data {path}: {what}")

    check_header(ACCELERATOR, data, path)
    name = data["name"]
    sections = {key: _section(data, key, fail) for key in _SECTIONS}

    def text(section: str, key: str) -> str:
        value = sections[section].get(key)
        if not isinstance(value, str) or not value:
            raise fail(f"'{section}.{key}' must be a non-empty string")
        return value

    def words(section: str, key: str) -> Tuple[str, ...]:
        value = sections[section].get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise fail(f"'{section}.{key}' must be a non-empty list of strings")
        return tuple(value)

    runtime = data.get("runtime")
    if not isinstance(runtime, str) or not runtime:
        raise fail("'runtime' must be a non-empty string")
    pattern = text("device_files", "pattern")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise fail(f"'device_files.pattern' is not a regular expression ({exc})") from None
    errors = sections["driver"].get("errors", {})
    if not isinstance(errors, dict) or not all(k.isdigit() and isinstance(v, str) for k, v in errors.items()):
        raise fail("'driver.errors' must map status codes (\"100\") to names")
    minimum = sections["driver"].get("minimum_for_runtime_major", {})
    if not isinstance(minimum, dict) or not all(k.isdigit() and type(v) is int for k, v in minimum.items()):
        raise fail("'driver.minimum_for_runtime_major' must map runtime majors (\"12\") to driver majors (525)")
    return Accelerator(
        name=name,
        runtime=runtime,
        visible_variables=words("visible_devices", "variables"),
        device_directory=text("device_files", "directory"),
        device_pattern=pattern,
        device_label=text("device_files", "label"),
        driver_library=text("driver", "library"),
        driver_init=text("driver", "init"),
        driver_count=text("driver", "count"),
        driver_errors={int(k): v for k, v in errors.items()},
        driver_version_file=text("driver", "version_file"),
        driver_minimum={int(k): v for k, v in minimum.items()},
        driver_too_old_fix=_optional_text(sections["driver"], "too_old_fix", fail),
        apptainer_flag=text("apptainer", "flag"),
        kubernetes_resource=text("kubernetes", "resource"),
        device_plugin=text("kubernetes", "device_plugin"),
        collective=text("collective", "name"),
        collective_library=text("collective", "library"),
        net_plugin=text("collective", "net_plugin"),
        ofi_plugin=text("collective", "ofi_plugin"),
        plugin_dlopens=_optional_text(sections["collective"], "plugin_dlopens", fail),
        plugin_dlopens_dirs=_optional_words(sections["collective"], "plugin_dlopens_dirs", fail),
        sampler=_sampler(sections["sampler"], words("sampler", "command"), fail),
        health=_health(sections["health"], fail),
        sources={key: text(key, "source") for key in _SECTIONS},
        path=path,
    )


def _section(data: Mapping[str, object], key: str, fail) -> Dict[str, object]:
    value = data.get(key)
    if not isinstance(value, dict):
        raise fail(f"'{key}' must be an object (with a 'source')")
    return value


def _optional_text(section: Mapping[str, object], key: str, fail) -> Optional[str]:
    value = section.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise fail(f"'{key}' must be a non-empty string when given")
    return value


def _optional_words(section: Mapping[str, object], key: str, fail) -> Tuple[str, ...]:
    value = section.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise fail("'{}' must be a list of non-empty strings when given".format(key))
    return tuple(value)


def _sampler(section: Mapping[str, object], command: Tuple[str, ...], fail) -> Sampler:
    repeats = section.get("repeats")
    if not isinstance(repeats, bool):
        raise fail("'sampler.repeats' must be true or false")
    if repeats and not any(INTERVAL_PLACEHOLDER in word for word in command):
        raise fail(f"'sampler.command' repeats by itself, so one word must hold {INTERVAL_PLACEHOLDER}")
    columns = section.get("columns")
    if not isinstance(columns, dict) or set(columns) != set(SAMPLER_COLUMNS) or \
            not all(isinstance(v, str) and v for v in columns.values()):
        raise fail(f"'sampler.columns' must name a column for each of {', '.join(SAMPLER_COLUMNS)}")
    unit = section.get("memory_unit_bytes")
    if isinstance(unit, bool) or not isinstance(unit, int) or unit <= 0:
        raise fail("'sampler.memory_unit_bytes' must be a positive integer")
    return Sampler(command, repeats, dict(columns), unit, str(section.get("source")))


def _health(section: Mapping[str, object], fail) -> Health:
    def text_in(where: Mapping[str, object], key: str, name: str) -> str:
        value = where.get(key)
        if not isinstance(value, str) or not value:
            raise fail("'{}' must be a non-empty string".format(name))
        return value

    def objects(value: object, name: str) -> List[Mapping[str, object]]:
        if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
            raise fail("'{}' must be a non-empty list of objects".format(name))
        return value

    def choice(where: Mapping[str, object], key: str, allowed: Sequence[str], name: str) -> str:
        value = where.get(key)
        if value not in allowed:
            raise fail("'{}' must be one of {}, got {!r}".format(name, ", ".join(allowed), value))
        return str(value)

    commands = []
    for index, command in enumerate(objects(section.get("commands"), "health.commands")):
        argv = command.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(w, str) and w for w in argv):
            raise fail("'health.commands[{}].argv' must be a non-empty list of strings".format(index))
        if not isinstance(command.get("required"), bool):
            raise fail("'health.commands[{}].required' must be true or false".format(index))
        commands.append(HealthCommand(tuple(argv), bool(command["required"])))
    if not commands[0].required:
        raise fail("'health.commands[0]' must be required: it is the one that lists the GPUs")
    rules_data = section.get("rules")
    if not isinstance(rules_data, dict) or not rules_data:
        raise fail("'health.rules' must map each rule's name to its signals and source")
    rules = []
    for name, rule in rules_data.items():
        where = "health.rules.{}".format(name)
        if not isinstance(rule, dict):
            raise fail("'{}' must be an object with 'signals' and 'source'".format(where))
        signals = tuple(HealthSignal(text_in(s, "path", where + ".signals[].path"),
                                     choice(s, "fails_when", FAILS_WHEN, where + ".signals[].fails_when"))
                        for s in objects(rule.get("signals"), where + ".signals"))
        rules.append(HealthRule(name, signals, text_in(rule, "source", where + ".source"),
                                choice(rule, "kind", RULE_KINDS, where + ".kind")))
    temperature = section.get("temperature")
    if not isinstance(temperature, dict):
        raise fail("'health.temperature' must be an object with 'limits' and 'source'")
    limits = tuple(TemperatureLimit(text_in(t, "current", "health.temperature.limits[].current"),
                                    text_in(t, "limit", "health.temperature.limits[].limit"),
                                    choice(t, "slow_when", SLOW_WHEN, "health.temperature.limits[].slow_when"))
                   for t in objects(temperature.get("limits"), "health.temperature.limits"))
    tool_missing_fix = text_in(section, "tool_missing_fix", "health.tool_missing_fix")
    try:
        tool_missing_fix.format(**FIX_PLACEHOLDERS)
    except (KeyError, IndexError, ValueError):
        raise fail("'health.tool_missing_fix' may hold only {{{}}}".format("}, {".join(FIX_PLACEHOLDERS))) from None
    return Health(
        commands=tuple(commands),
        format=choice(section, "format", HEALTH_FORMATS, "health.format"),
        partitions=_optional_text(section, "partitions", fail),
        rules=tuple(rules),
        temperatures=limits,
        temperature_source=text_in(temperature, "source", "health.temperature.source"),
        tool_missing_fix=tool_missing_fix,
        source=text_in(section, "source", "health.source"),
    )


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
