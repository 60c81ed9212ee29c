"""Known-bad host stacks as data: one row per problem that upstream trackers document, with its public
source, the versions and settings it covers, its effect and its fix, matched against what a node loads.

The rows ship in containers/sites/known-issues/upstream.json (found like the other data files:
ddp_contract.data_files); a site or a user adds rows of their own in files of the same shape, named
by DDP_KNOWN_ISSUES (paths separated by ":") or `ddp-launch doctor --known-issues FILE`. A new row is
one entry in a file: what it may match is the Stack below, read by the doctor before training
(ddp_launch/doctor/known_issues.py) and by the trainer's provenance from what it mapped.

A row matches when every version, pattern and setting it names matches the stack, none of its
"unless" settings does, and the stack knows each component it names (an unknown version matches
nothing: a row is a claim about a version, and a guess would fail a healthy job). Its verdict: FAIL
for a hang, a crash or corrupt data, WARN for a slowdown, and WARN too where the row's "when" names a
condition of the workload that no version shows (a CUDA graph captured around a first connection).
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ddp_contract.data_files import Kind, check_header, find_or_fail, read_json_file, search_path
from ddp_contract.errors import LaunchError
from ddp_contract.records import LIST, STRING, TEXT, VARIABLE_NAME, Field, Reader, is_text, must_be, one_of

KNOWN_ISSUES = Kind("known issues", "known-issues", frozenset({"description", "rows"}), True,
                    "restore containers/sites/known-issues from the repository (the image copies it to /opt/ddp/sites)")
SHIPPED = "upstream"                    # containers/sites/known-issues/upstream.json
# Where the image names its base: Apptainer keeps %labels here inside the container (its user guide,
# "Environment and Metadata"), and gpu.def labels the base it was built from.
IMAGE_LABELS_FILE = "/.singularity.d/labels.json"
BASE_LABEL = "org.opencontainers.image.base.name"
USER_FILES_VAR = "DDP_KNOWN_ISSUES"     # more files, ":"-separated

# The doctor's check: "known issues" when nothing matches, "known issue <id>" for each match (the
# preflight's verdict reads these names: ddp_contract.quarantine).
CHECK_NAME = "known issues"
CHECK_PREFIX = "known issue "

HANG, CRASH, CORRUPT, SLOW = "hang", "crash", "corrupt", "slow"
EFFECTS = (HANG, CRASH, CORRUPT, SLOW)
FAIL, WARN = "FAIL", "WARN"
# What a row's "versions" may name, compared as versions: the NCCL (or RCCL) the workers load, the OFI
# plugin (aws-ofi-nccl, which builds RCCL's too since 1.18), libfabric (fi_version(): major.minor), libcxi
# (its file's version), torch, the GPU driver (its kernel module).
VERSIONED = ("nccl", "aws-ofi-nccl", "libfabric", "libcxi", "torch", "driver", "nodes")   # nodes: in the job
# ... and compared as shell patterns (fnmatch): the image's base (its org.opencontainers.image.base.name
# label), the GPU vendor and model (the site profile's accelerator and gpu) and the machine (os.uname().machine).
PATTERNED = ("base_image", "accelerator", "gpu", "machine")
COMPONENTS = VERSIONED + PATTERNED
_CLAUSE = re.compile(r"^(==|!=|<=|>=|<|>)?(\d+(?:\.\d+)*)$")


def version_key(version: str) -> Optional[tuple]:
    """The leading numbers of a version ("2.7.0a0+nv25.06" -> (2, 7, 0)), or None."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def _compare(have: tuple, op: str, want: tuple) -> bool:
    # A missing part counts as 0 on either side ("2.4" == "2.4.0"). libfabric reports major.minor alone
    # (fi_version()), so a libfabric row is written as major.minor: "==2.4" holds for every 2.4.x.
    width = max(len(have), len(want))
    have, want = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {"==": have == want, "!=": have != want, "<": have < want, "<=": have <= want,
            ">": have > want, ">=": have >= want}[op]


def spec_problem(spec: object) -> Optional[str]:
    """Why spec is no version spec ("==2.30.4", ">=2.28.9,<2.29.3", "2.30.4"), or None."""
    if not isinstance(spec, str) or not spec.strip():
        return "must be a version spec like '>=2.28.9,<2.29.3'"
    bad = [clause for clause in spec.split(",") if not _CLAUSE.match(clause.strip())]
    return f"has {bad[0]!r}, not OP VERSION (OP one of == != < <= > >=)" if bad else None


def version_matches(version: str, spec: str) -> bool:
    have = version_key(version)
    if have is None:
        return False
    for clause in spec.split(","):
        op, want = _CLAUSE.match(clause.strip()).groups()
        if not _compare(have, op or "==", tuple(int(p) for p in want.split("."))):
            return False
    return True


@dataclass(frozen=True)
class Row:
    """One known problem: what it covers, what it does, what to do, and where that is said."""

    id: str
    summary: str
    effect: str
    versions: Mapping[str, str]         # component -> version spec or pattern
    settings: Mapping[str, str]         # variable -> pattern its effective value must match ("*": set at all)
    unless: Mapping[str, str]           # variable -> pattern: the row does not apply where one matches
    when: Optional[str]                 # a condition of the workload no version shows: the verdict is WARN
    fix: str
    source: str
    file: str

    @property
    def verdict(self) -> str:
        return FAIL if self.effect in (HANG, CRASH, CORRUPT) and self.when is None else WARN


@dataclass(frozen=True)
class Stack:
    """What a node loads: each component's version (None: not known here) and where it was found, and
    every variable the workers' NCCL and libfabric will see (environment, plan, NCCL's config files)."""

    versions: Mapping[str, Optional[str]]
    where: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    row: Row
    matched: Mapping[str, str]          # component or variable -> the value it matched with

    @property
    def verdict(self) -> str:
        return self.row.verdict

    def line(self) -> str:
        """One line: what matched, what happens, where it is said (the fix is the doctor check's own)."""
        what = ", ".join(f"{name} {value}" for name, value in self.matched.items())
        when = f", when {self.row.when}" if self.row.when else ""
        return f"{what}: {self.row.summary} ({self.row.effect}{when}; {self.row.source})"

    def record(self) -> dict:
        return {"id": self.row.id, "verdict": self.verdict, "effect": self.row.effect, "summary": self.row.summary,
                "matched": dict(self.matched), "when": self.row.when, "fix": self.row.fix,
                "source": self.row.source, "file": self.row.file}


# The OFI plugin logs "Initializing " PACKAGE_STRING at start-up (aws-ofi-nccl src/nccl_ofi_net.cpp), autoconf's
# "aws-ofi-nccl 1.21.0" (AC_INIT in configure.ac), so the string is in the library; ROCm's older fork says
# aws-ofi-rccl.
_PLUGIN_PACKAGE = re.compile(rb"aws-ofi-[nr]ccl (\d+\.\d+(?:\.\d+)?)")


def plugin_version(path: str) -> Optional[str]:
    """The OFI plugin's version from the package string in its file, or None (another plugin, unreadable)."""
    try:
        with open(path, "rb") as handle:
            found = _PLUGIN_PACKAGE.search(handle.read())
    except OSError:
        return None
    return found.group(1).decode() if found else None


def driver_version(text: Optional[str]) -> Optional[str]:
    """major.minor of the kernel driver: NVIDIA's /proc/driver/nvidia/version line ("Kernel Module
    570.124.06"), or a file that holds the version alone (/sys/module/amdgpu/version)."""
    found = re.search(r"Kernel Module(?: for \S+)?\s+(\d+)\.(\d+)", text or "") or re.match(r"(\d+)\.(\d+)", text or "")
    return f"{found.group(1)}.{found.group(2)}" if found else None


def check_name(row_id: str) -> str:
    return CHECK_PREFIX + row_id


def describe(stack: Stack) -> str:
    """The stack in one line: each component's version (? where unknown), with where the libraries were found."""
    parts = []
    for name in COMPONENTS:
        if name not in stack.versions:
            continue
        value = stack.versions[name]
        where = stack.where.get(name)
        parts.append(f"{name} {value if value is not None else '?'}" + (f" ({where})" if where and value else ""))
    return ", ".join(parts)


def _setting_matches(value: Optional[str], pattern: str) -> bool:
    return value is not None and fnmatch.fnmatchcase(value, pattern)


def match(row: Row, stack: Stack) -> Optional[Match]:
    """The row's match against the stack, or None."""
    matched = {}
    for name, spec in row.versions.items():
        value = stack.versions.get(name)
        if value is None:
            return None
        holds = fnmatch.fnmatchcase(value, spec) if name in PATTERNED else version_matches(value, spec)
        if not holds:
            return None
        matched[name] = value
    for name, pattern in row.settings.items():
        if not _setting_matches(stack.settings.get(name), pattern):
            return None
        matched[name] = stack.settings[name]
    if any(_setting_matches(stack.settings.get(name), pattern) for name, pattern in row.unless.items()):
        return None
    return Match(row, matched)


def matches(rows: Sequence[Row], stack: Stack) -> tuple[Match, ...]:
    return tuple(found for found in (match(row, stack) for row in rows) if found is not None)


# -- the files ---------------------------------------------------------------------------------

_ROW_KEYS = ("id", "summary", "effect", "versions", "settings", "unless", "when", "fix", "source")
_OBJECT_OF_STRINGS = must_be("an object of strings", lambda value: isinstance(value, dict) and all(
    isinstance(v, str) and v for v in value.values()))
_ROW = (
    Field("id", (must_be("a short name of letters, digits, '.', '_' or '-'", lambda value: isinstance(
        value, str) and re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", value) is not None),)),
    Field("summary", (TEXT,)),
    Field("effect", (one_of(EFFECTS),)),
    Field("versions", (_OBJECT_OF_STRINGS,), {}),
    Field("settings", (_OBJECT_OF_STRINGS,), {}),
    Field("unless", (_OBJECT_OF_STRINGS,), {}),
    Field("when", (must_be("a non-empty string or absent", lambda value: value is None or is_text(value)),), None),
    Field("fix", (TEXT,)),
    Field("source", (must_be("a public source (a URL, an upstream issue, a manual)", is_text),)),
)


def parse_file(data: object, path: str) -> tuple[Row, ...]:
    """A known-issues file's rows; every problem one line naming the file, the row and the key."""
    check_header(KNOWN_ISSUES, data, path)
    reader = Reader(KNOWN_ISSUES.what, path)
    reader.check(data.get("description", ""), (STRING,), "'description'")
    reader.check(data.get("rows"), (LIST,), "'rows'")
    rows = []
    for index, item in enumerate(data["rows"]):
        where = f"rows[{index}]"
        reader.check(item, (must_be("an object", lambda value: isinstance(value, dict)),), where)
        unknown = sorted(set(item) - set(_ROW_KEYS))
        if unknown:
            raise reader.error(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(_ROW_KEYS)}")
        found = reader.record(item, _ROW, f"{where}.{{}}")
        for name, spec in found["versions"].items():
            if name not in COMPONENTS:
                raise reader.error(f"{where}.versions names {name!r}; use {', '.join(COMPONENTS)}")
            problem = spec_problem(spec) if name in VERSIONED else None
            if problem:
                raise reader.error(f"{where}.versions.{name} {problem}")
        for key in ("settings", "unless"):
            bad = [name for name in found[key] if not VARIABLE_NAME.match(name)]
            if bad:
                raise reader.error(f"{where}.{key} names {bad[0]!r}, not an environment variable")
        if not (found["versions"] or found["settings"]):
            raise reader.error(f"{where} names no version and no setting, so it would match every node")
        rows.append(Row(file=path, **found))
    return tuple(rows)


def read_file(path: str) -> tuple[Row, ...]:
    return parse_file(read_json_file(path, KNOWN_ISSUES.what), path)


def user_files(env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(path for path in env.get(USER_FILES_VAR, "").split(":") if path)


def load_rows(env: Mapping[str, str], extra: Sequence[str] = ()) -> tuple[Row, ...]:
    """The shipped rows, then those of DDP_KNOWN_ISSUES's files and extra's, in order; an id twice is an
    error naming both files (a user's row must not silently replace a shipped one)."""
    paths = (find_or_fail(KNOWN_ISSUES, SHIPPED, search_path(KNOWN_ISSUES, env)), *user_files(env), *extra)
    rows, seen = [], {}
    for path in paths:
        if not os.path.isfile(path):
            raise LaunchError(f"known-issues file {path} does not exist (named by {USER_FILES_VAR} or "
                              f"--known-issues): fix the path")
        for row in read_file(path):
            if row.id in seen:
                raise LaunchError(f"known issue {row.id!r} is in {seen[row.id]} and in {path}: give the new row an "
                                  f"id of its own")
            seen[row.id] = path
            rows.append(row)
    return tuple(rows)
