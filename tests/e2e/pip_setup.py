"""pip's configuration on this machine, made whole inside the e2e test base.

The test base's pip installs torch from the same sources as `make venv` here, so it must
see the same configuration: pip's configuration files, `PIP_CONFIG_FILE` and the `PIP_*`
variables, which `pip config list` shows merged, each key once with the value that wins
(pip's user guide, "Configuration": https://pip.pypa.io/en/stable/topics/configuration/).
A value can name a file or directory on this machine: a constraints file under /etc, a CA
bundle, a local index. Those must exist inside the base too, or pip stops at once ("Could
not open requirements file"). So the files are copied into the base at the same path (they
are small; their digests go into the base's recipe, so a changed cap rebuilds the base),
and the directories (indexes of wheels, gigabytes) are bound in at the same path.

Parse (`pip config list` text) -> decide (`resolve`: a PipSetup) -> act (`stage`: copy into a tree).
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping
from urllib.parse import unquote, urlparse

# Options whose values name files pip reads (`pip install --help`; pip's user guide,
# "Requirements File Format" and "Constraints Files"): copied into the base.
FILE_OPTIONS = ("constraint", "requirement", "build-constraint", "cert", "client-cert")
# Options whose values name where pip finds packages: a local path or file:// URL is bound in.
SOURCE_OPTIONS = ("find-links", "index-url", "extra-index-url")
# Options that would make pip in the base install somewhere else, or refuse: the base's pip
# installs into its system Python (a rootfs, not a venv), with --no-cache-dir.
DROPPED_OPTIONS = ("require-virtualenv", "user", "target", "prefix", "root", "cache-dir", "log", "src")
# Lines inside a requirements or constraints file that name another file or a source
# (pip's user guide, "Requirements File Format", "Supported options").
_NESTED = re.compile(r"^\s*(-r|--requirement|-c|--constraint|-f|--find-links|-i|--index-url|--extra-index-url)"
                     r"(?:\s*=\s*|\s+)(\S+)")
_LIST_LINE = re.compile(r"^(:env:|[\w-]+)\.([\w-]+)=(.*)$")


class PipSetupError(RuntimeError):
    """pip's configuration names something the base cannot be given; the message says what."""


@dataclass(frozen=True)
class PipSetup:
    """What pip in the base needs: its configuration file's text, the files that text names
    (path, sha256), copied in at the same path, and the local directories, bound in."""

    conf: str
    files: tuple = ()
    directories: tuple = ()


def parse_config_list(text: str) -> dict:
    """`pip config list` output -> {section: {option: value}}; `:env:` (a PIP_* variable) is global."""
    sections: dict = {}
    for line in text.splitlines():
        match = _LIST_LINE.match(line.strip())
        if not match:
            continue
        try:
            value = ast.literal_eval(match.group(3))  # pip prints repr(value)
        except (ValueError, SyntaxError):
            continue
        section = "global" if match.group(1) == ":env:" else match.group(1)
        sections.setdefault(section, {})[match.group(2)] = str(value)
    return sections


def read_config_list(env: Mapping[str, str] | None = None) -> str:
    """`pip config list` of the pip that `make venv` uses (this Python's), in env."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          env=dict(os.environ if env is None else env))
    if done.returncode != 0:
        raise PipSetupError(f"pip config list failed (exit {done.returncode}): "
                            f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
    return done.stdout


def _local_path(word: str) -> Path | None:
    """The local path a value names (an absolute path or a file:// URL), else None (a web URL)."""
    if word.startswith("file:"):
        return Path(unquote(urlparse(word).path))
    if word.startswith("/"):
        return Path(word)
    return None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source_directory(path: Path) -> Path:
    """The directory to bind for a local source: a file:// simple index binds its parent,
    so packages the index links with '../' stay reachable."""
    return path.parent if path.name == "simple" else path


def _nested(path: Path, files: dict, directories: list, option: str) -> None:
    """A requirements or constraints file and every file or source it names, relative
    references resolved from its own directory, as pip does."""
    if path in files:
        return
    if not path.is_file():
        raise PipSetupError(f"pip's configuration names {path} ({option}), which is not a readable file here: "
                            f"fix or remove that setting (pip config list shows where it comes from)")
    files[path] = _digest(path)
    for line in path.read_text(errors="replace").splitlines():
        match = _NESTED.match(line)
        if not match:
            continue
        flag, word = match.groups()
        local = _local_path(word) if "://" in word or word.startswith("/") else path.parent / word
        if local is None:
            continue
        if flag in ("-r", "--requirement", "-c", "--constraint"):
            _nested(local, files, directories, f"named in {path}")
        elif local.is_dir():
            directories.append(_source_directory(local))


def resolve(sections: Mapping[str, Mapping[str, str]]) -> PipSetup:
    """The base's pip configuration from this machine's: each file it names (and the files
    those name) listed with its digest, each local package source listed to bind."""
    files: dict = {}
    directories: list = []
    lines = []
    for section, options in sections.items():
        kept = {name: value for name, value in options.items() if name not in DROPPED_OPTIONS}
        if not kept:
            continue
        lines.append(f"[{section}]")
        for name, value in sorted(kept.items()):
            words = value.split()
            if name in FILE_OPTIONS:
                for word in words:
                    if "://" in word and not word.startswith("file:"):
                        continue  # a web address: reached over the network, as here
                    local = _local_path(word) or Path(word).absolute()
                    if name in ("constraint", "requirement", "build-constraint"):
                        _nested(local, files, directories, name)
                    elif local.is_file():
                        files[local] = _digest(local)
                    else:
                        raise PipSetupError(f"pip's configuration names {local} ({name}), which is not a "
                                            f"readable file here: fix or remove that setting")
            elif name in SOURCE_OPTIONS:
                for word in words:
                    local = _local_path(word)
                    if local is not None and local.exists():
                        directories.append(_source_directory(local) if local.is_dir() else local.parent)
            # pip reads a multi-value option one value per line, indented (configparser).
            lines.append(f"{name} = " + "\n    ".join(words) if len(words) > 1 else f"{name} = {value}")
    unique_dirs = tuple(dict.fromkeys(str(d) for d in directories))
    return PipSetup(conf="\n".join(lines) + "\n",
                    files=tuple(sorted((str(path), digest) for path, digest in files.items())),
                    directories=unique_dirs)


def machine_setup(env: Mapping[str, str] | None = None) -> PipSetup:
    """This machine's pip configuration, resolved for the base."""
    return resolve(parse_config_list(read_config_list(env)))


def stage(setup: PipSetup, tree: Path) -> list[str]:
    """Write the configuration to tree/etc/pip.conf and copy each file it names into tree at
    the same path; return ch-run's bind arguments for the local sources (their mount points
    made in tree). A file under a directory that is also bound is copied all the same: the
    copy is what the base keeps for `make build-*`, which has no binds."""
    (tree / "etc").mkdir(parents=True, exist_ok=True)
    _replace(tree / "etc/pip.conf", setup.conf.encode())
    for path, digest in setup.files:
        data = Path(path).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise PipSetupError(f"{path} changed while the test base was being built: run the tests again")
        _replace(tree / path.lstrip("/"), data)
    binds = []
    for directory in setup.directories:
        (tree / directory.lstrip("/")).mkdir(parents=True, exist_ok=True)
        binds += ["-b", f"{directory}:{directory}"]
    return binds


def _replace(target: Path, data: bytes) -> None:
    """Write target anew: never through an existing inode, which a hard-linked copy of an
    image (e2e_image.charliecloud_copy) shares with the image it was copied from."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    target.write_bytes(data)
