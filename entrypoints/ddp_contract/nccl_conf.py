"""The settings NCCL reads from files nobody looks at: /etc/nccl.conf, ~/.nccl.conf and $NCCL_CONF_FILE.

NCCL's rules, from its source (NVIDIA/nccl src/misc/param.cc, initEnvFunc and setEnvFile) and its
environment documentation (docs/userguide/source/env.rst, NCCL_CONF_FILE: "since 2.23 ... If unset or
if the version is prior to 2.23, NCCL uses .nccl.conf in the home directory if available"):
- it reads $NCCL_CONF_FILE when that is set and not empty (NCCL >= 2.23), else $HOME/.nccl.conf, and
  then /etc/nccl.conf;
- each line NAME=VALUE is split at its first "=" and nothing is trimmed ("NCCL_X = 1" sets a variable
  named "NCCL_X ", which NCCL never asks for); a line without "=" is skipped, and so is one starting
  with "#" (2.26 on; earlier NCCL sets a variable named "#NAME", which nothing reads either);
- each is setenv(NAME, VALUE, 0): the process environment wins, and the first file to set a name wins.
RCCL keeps NCCL's param.cc. Apptainer and SingularityCE bind $HOME by default (Apptainer user guide,
"Bind Paths and Mounts", system-defined bind paths), so a stale ~/.nccl.conf on the host reaches every
job's NCCL, whatever image it runs. Read inside the container, as NCCL reads them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

SYSTEM_FILE = "/etc/nccl.conf"
USER_FILE = ".nccl.conf"            # in $HOME
CONF_FILE_VAR = "NCCL_CONF_FILE"
CONF_FILE_SINCE = (2, 23)           # NCCL reads NCCL_CONF_FILE from this version on (env.rst)

APPLIES = "applies"
ENVIRONMENT_WINS = "the environment's value wins"
EARLIER_FILE_WINS = "an earlier file's value wins"
NEVER_READ = "never read: the name has spaces around it, and NCCL trims nothing"


@dataclass(frozen=True)
class ConfFile:
    """One file NCCL would read, in its order, and why."""

    path: str
    why: str            # "/etc/nccl.conf" | "~/.nccl.conf" | "NCCL_CONF_FILE"
    text: Optional[str] # None: the file does not exist or cannot be read


@dataclass(frozen=True)
class ConfLine:
    """One NAME=VALUE line, and what becomes of it in a process with the given environment."""

    path: str
    why: str
    number: int
    name: str
    value: str
    effect: str         # APPLIES | ENVIRONMENT_WINS | EARLIER_FILE_WINS | NEVER_READ
    text: str = ""      # the line as written

    @property
    def where(self) -> str:
        return f"{describe_file(self.path, self.why)} line {self.number}"

    def record(self) -> dict:
        return {"file": self.path, "read_as": self.why, "line": self.number, "name": self.name,
                "value": self.value, "effect": self.effect}


def describe_file(path: str, why: str) -> str:
    """How a message names the file: "~/.nccl.conf (/home/u/.nccl.conf)", "NCCL_CONF_FILE=/x", "/etc/nccl.conf"."""
    if why == CONF_FILE_VAR:
        return f"{why}={path}"
    return f"{why} ({path})" if why != path else path


def version_tuple(version: Optional[str]) -> Optional[tuple]:
    """(major, minor) of "2.27.7", or None."""
    try:
        major, minor = (version or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def reads_conf_file_var(nccl_version: Optional[str]) -> bool:
    """Whether this NCCL reads NCCL_CONF_FILE; an unknown version is taken to (every NCCL of 2025 on does)."""
    parsed = version_tuple(nccl_version)
    return parsed is None or parsed >= CONF_FILE_SINCE


def files_nccl_reads(env: Mapping[str, str], nccl_version: Optional[str]) -> tuple[tuple[str, str], ...]:
    """(path, why) of each file, in the order NCCL reads them."""
    chosen = env.get(CONF_FILE_VAR, "")
    if chosen and reads_conf_file_var(nccl_version):
        first: tuple = ((chosen, CONF_FILE_VAR),)
    elif env.get("HOME"):
        first = ((os.path.join(env["HOME"], USER_FILE), f"~/{USER_FILE}"),)
    else:
        first = ()
    return (*first, (SYSTEM_FILE, SYSTEM_FILE))


def read_files(files: Sequence[tuple[str, str]], root: str = "/") -> tuple[ConfFile, ...]:
    """The edge: each file's text, read under root (a test's tree), or None where there is none."""
    found = []
    for path, why in files:
        try:
            with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as handle:
                found.append(ConfFile(path, why, handle.read()))
        except OSError:
            found.append(ConfFile(path, why, None))
    return tuple(found)


def lines_of(files: Sequence[ConfFile], env: Mapping[str, str]) -> tuple[ConfLine, ...]:
    """Every NAME=VALUE line of the files, each with its effect in a process whose environment is env."""
    lines, taken = [], set()
    for conf in files:
        for number, line in enumerate((conf.text or "").splitlines(), start=1):
            line = line.rstrip("\r")
            if line.startswith("#") or "=" not in line:
                continue
            name, _, value = line.partition("=")
            if name != name.strip():
                effect = NEVER_READ
            elif name in env:
                effect = ENVIRONMENT_WINS
            elif name in taken:
                effect = EARLIER_FILE_WINS
            else:
                effect = APPLIES
                taken.add(name)
            lines.append(ConfLine(conf.path, conf.why, number, name.strip(), value, effect, line))
    return tuple(lines)


def settings(env: Mapping[str, str], nccl_version: Optional[str], root: str = "/") -> tuple[ConfLine, ...]:
    """What the files NCCL reads set, and which of it takes effect, for a process with env."""
    return lines_of(read_files(files_nccl_reads(env, nccl_version), root), env)


def applied(lines: Sequence[ConfLine]) -> dict[str, str]:
    """{name: value} of the lines that take effect."""
    return {line.name: line.value for line in lines if line.effect == APPLIES}
