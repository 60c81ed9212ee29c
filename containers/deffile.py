"""Apptainer definition files as text: {{ VAR }} build arguments and raw section bodies.

spython parses the recipe structure (files, environment, runscript); this keeps
what spython rewrites (the %test and %arguments bodies) for tests and the Dockerfile.
"""

from __future__ import annotations

import re
import textwrap
from typing import Dict, Mapping

_SECTION = re.compile(r"^%(\w+)\s*$", re.M)
_TEMPLATE = re.compile(r"\{\{\s*(\w+)\s*\}\}")
_COMMENT = re.compile(r"#[^!]")


def sections(text: str) -> Dict[str, str]:
    """Section name -> body (dedented, comments kept); '' for the header."""
    parts = _SECTION.split(text)
    result = {"": parts[0]}
    for name, body in zip(parts[1::2], parts[2::2]):
        result[name] = textwrap.dedent(body).strip("\n") + "\n"
    return result


def build_arguments(text: str) -> Dict[str, str]:
    """Defaults declared in %arguments (NAME=value per line)."""
    body = sections(text).get("arguments", "")
    pairs = (line.split("=", 1) for line in body.splitlines() if "=" in line and not line.lstrip().startswith("#"))
    return {name.strip(): value.strip() for name, value in pairs}


def render(text: str, overrides: Mapping[str, str] = {}) -> str:
    """Substitute {{ VAR }} as `apptainer build --build-arg` does; unknown names are an error.

    As Apptainer does, a {{ VAR }} after a `#` on its line is a comment and stays as written
    (internal/pkg/build/args/reader.go: commentLineRegexp, `#` then any character but `!`).
    """
    values = {**build_arguments(text), **overrides}

    def substitute(match: "re.Match[str]") -> str:
        line_start = match.string.rfind("\n", 0, match.start()) + 1
        if _COMMENT.search(match.string, line_start, match.start()):
            return match.group(0)
        name = match.group(1)
        if name not in values:
            raise KeyError(f"build argument {name} is used but has no default in %arguments and no --build-arg")
        return values[name]

    without_arguments = re.sub(r"^%arguments\s*\n(?:[ \t]+.*\n|[ \t]*\n)*", "", text, flags=re.M)
    return _TEMPLATE.sub(substitute, without_arguments)
