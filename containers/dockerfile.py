"""Generate the Dockerfile (RunAI / Kubernetes) from an Apptainer definition with spython.

spython's writer turns %runscript into a shell-form CMD, which drops the
container's arguments; we swap it for an exec-form ENTRYPOINT so
`docker run IMAGE --nodes 2` reaches ddp-launch, and run %test as a build step.
Every %arguments name but BOOTSTRAP and %help's (HELP_*) becomes an ARG whose default is the definition's
(or this script's --build-arg), so `docker build --build-arg` means what
`apptainer build --build-arg` does; BASE_IMAGE is declared before FROM as well, so a
test can build the same recipe on another base. %files become COPY, which Docker and
Charliecloud's ch-image both build (ch-image 0.31 ignores ADD).
Usage: python containers/dockerfile.py [--def PATH] [--build-arg K=V ...] [-o FILE]
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from deffile import build_arguments, render, sections  # beside this script, first on sys.path

_SHELL_ONLY_EXPANSION = re.compile(r"\$\{\w+:[-+]")
# `export NAME="${NAME:-value}"`: Apptainer's image environment overrides the host's, so a
# default the user may override is written this way; Docker's ENV already is one (docker
# run -e and a pod's env win), so it becomes `ENV NAME="value"`.
_DEFAULT_ONLY = re.compile(r'^ENV (?P<name>\w+)="?\$\{(?P=name):-(?P<value>.*)\}"?$')
# How Apptainer gets the base (docker | localimage); Docker has only FROM.
APPTAINER_ONLY_ARGUMENTS = ("BOOTSTRAP",)
# What only %help reads (gpu.def's header): a Dockerfile has no help for them to fill in.
HELP_ARGUMENTS = "HELP_"
EXPECTED_RUNSCRIPT = 'exec ddp-launch "$@"'
ENTRYPOINT = '["ddp-launch"]'
DEFAULT_DEF = os.path.join("containers", "gpu.def")


def generate(def_path: str, build_args: Dict[str, str]) -> str:
    from spython.main.parse.parsers import SingularityParser
    from spython.main.parse.writers import DockerWriter

    with open(def_path, encoding="utf-8") as handle:
        text = handle.read()
    base = re.search(r"^From:\s*(\S+)", sections(render(text, build_args))[""], re.M)
    if not base:
        raise ValueError(f"{def_path}: no `From:` line in the header")
    base_image = base.group(1)
    defaults = {name: value for name, value in {**build_arguments(text), **build_args}.items()
                if name not in APPTAINER_ONLY_ARGUMENTS and not name.startswith(HELP_ARGUMENTS)}
    rendered = render(text, {**build_args, **{name: "${%s}" % name for name in defaults}})
    # Each RUN fails the build on its own, so `set -e` (needed in %test) is dropped.
    test_lines = [
        line for line in sections(rendered).get("test", "").splitlines()
        if line.strip() and not line.lstrip().startswith("#") and line.strip() != "set -e"
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".def", delete=False) as handle:
        handle.write(rendered)
        temporary = handle.name
    try:
        logging.disable(logging.WARNING)
        recipe = SingularityParser(temporary).recipe
    finally:
        logging.disable(logging.NOTSET)
        os.unlink(temporary)
    for stage in recipe.values():
        if (stage.cmd or "").strip() != EXPECTED_RUNSCRIPT:
            raise ValueError(f"{def_path}: %runscript must be `{EXPECTED_RUNSCRIPT}`, found {stage.cmd!r}")
        stage.cmd = None
        stage.entrypoint = ENTRYPOINT
        stage.install = [line for line in stage.install if "/tests.sh" not in line] + test_lines
        stage.test = None
        stage.comments = []
    header = [
        f"# Generated from {def_path} by containers/dockerfile.py (make dockerfile); do not edit.",
        "# Build: docker build -f containers/Dockerfile -t ddp-train . (from the repository root)",
    ]
    return "\n".join(header) + "\n" + _with_arguments(DockerWriter(recipe).convert(), base_image, defaults) + "\n"


def _argument(name: str, value: str) -> str:
    # ch-image 0.31 parses `ARG NAME=` only with a word or a quoted string after the `=`.
    return f"ARG {name}={value}" if value and not re.search(r'[\s"]', value) else f'ARG {name}="{value}"'


def _with_arguments(dockerfile: str, base_image: str, defaults: Dict[str, str]) -> str:
    """FROM the BASE_IMAGE build argument, declared before FROM for it and again inside the
    stage with the other arguments, as Docker scopes ARGs ("Understand how ARG and FROM
    interact"); ADD of local files as COPY; a default-only ENV as a plain one."""
    lines = []
    for line in dockerfile.splitlines():
        default_only = _DEFAULT_ONLY.match(line)
        if line.startswith("FROM "):
            stage = line.split(" AS ", 1)[1] if " AS " in line else "spython-base"
            # $BASE_IMAGE, not ${BASE_IMAGE}: ch-image 0.31's FROM grammar takes only the plain form.
            lines += [f"ARG BASE_IMAGE={base_image}", f"FROM $BASE_IMAGE AS {stage}", "ARG BASE_IMAGE"]
            lines += [_argument(name, value) for name, value in defaults.items() if name != "BASE_IMAGE"]
        elif line.startswith("ADD "):
            lines.append("COPY " + line[len("ADD "):])
        elif default_only:
            lines.append(f'ENV {default_only.group("name")}="{default_only.group("value")}"')
        elif line.startswith("ENV ") and _SHELL_ONLY_EXPANSION.search(line):
            raise ValueError(f"%environment line `{line[len('ENV '):]}` uses ${{VAR:+...}} or ${{VAR:-...}}, which "
                             "ch-image cannot build (charliecloud issue #774): assign the value plainly")
        else:
            lines.append(line)
    return "\n".join(lines)


def parse_build_args(pairs: Sequence[str]) -> Dict[str, str]:
    result = {}
    for pair in pairs:
        if "=" not in pair:
            raise SystemExit(f"dockerfile.py: error: --build-arg {pair!r} must be NAME=VALUE")
        name, value = pair.split("=", 1)
        result[name] = value
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Dockerfile from an Apptainer definition file")
    parser.add_argument("--def", dest="definition", default=DEFAULT_DEF)
    parser.add_argument("--build-arg", action="append", default=[])
    parser.add_argument("-o", "--output", help="write here instead of stdout")
    args = parser.parse_args(argv)
    try:
        text = generate(args.definition, parse_build_args(args.build_arg))
    except (OSError, KeyError, ValueError) as exc:
        print(f"dockerfile.py: error: {exc}", file=sys.stderr)
        return 2
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"dockerfile.py: wrote {args.output} from {args.definition}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
