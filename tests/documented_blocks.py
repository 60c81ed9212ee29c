"""The fenced code blocks of the documentation, as a reader copies them, and the quick starts' sbatch lines.

Shared by the unit tests, which run every command block (tests/unit/containers/test_command_blocks.py),
and the twins, which submit each quick start's sbatch line as the README writes it (tests/e2e/conftest.py).
A fence is CommonMark's (https://spec.commonmark.org/0.31.2/#fenced-code-blocks): three backticks,
an info string whose first word names the language, the lines, and a closing fence.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# Info strings of blocks that are a file's contents or a program's output, not commands to type.
NOT_COMMANDS = frozenset({"text", "json", "jsonc", "yaml"})
# Info strings of command blocks: none (the README's habit) or a shell.
SHELLS = frozenset({"", "bash", "sh", "shell"})
QUICK_START = "Quick start"
# The README's SLURM quick starts and the twin of each cluster (tests/e2e/cluster/twins/<name>.sh),
# which submits the quick start's sbatch line word for word.
QUICK_START_TWINS = {"Olivia": "olivia", "Raven": "raven", "LUMI-G": "lumi", "An Ethernet cluster": "ethernet"}

_FENCE = re.compile(r"^ {0,3}```(?P<info>[^`]*)$")
_HEADING = re.compile(r"^(?P<level>#{1,6}) +(?P<title>.*?)\s*#*\s*$")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def documentation() -> list[Path]:
    """Every page a user reads: the README, the containers' README and docs/*.md."""
    return [README, REPO / "containers" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Block:
    doc: str            # the page, relative to the repository
    line: int           # the opening fence's line, from 1
    info: str           # the info string's first word ("" when none)
    text: str           # the lines between the fences, each ending in a newline
    headings: tuple     # the titles of the headings it sits under, outermost first

    @property
    def first_line(self) -> str:
        return next((line for line in self.text.splitlines() if line.strip()), "")

    @property
    def key(self) -> tuple:
        """What names the block in a table that outlives line numbers: its page and its first line."""
        return (self.doc, self.first_line)

    @property
    def is_command(self) -> bool:
        return self.info not in NOT_COMMANDS

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """The fenced blocks of doc, in order; an unclosed fence is an error, as it swallows the page."""
    found, headings = [], []
    opened, info, lines = None, "", []
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        if opened is None:
            fence = _FENCE.match(line)
            heading = _HEADING.match(line)
            if fence:
                opened, info, lines = number, fence.group("info").split(" ")[0].strip(), []
            elif heading:
                level = len(heading.group("level"))
                headings = [*headings[:level - 1], *[""] * (level - 1 - len(headings)), heading.group("title")]
        elif line.strip() == "```":
            found.append(Block(str(doc.relative_to(REPO)), opened, info, "".join(f"{x}\n" for x in lines),
                               tuple(title for title in headings if title)))
            opened = None
        else:
            lines.append(line)
    if opened is not None:
        raise ValueError(f"{doc.relative_to(REPO)}:{opened}: the fence is never closed")
    return found


def command_blocks() -> list[Block]:
    return [block for doc in documentation() for block in blocks(doc) if block.is_command]


def quick_starts() -> dict[str, Block]:
    """The README's quick starts, {cluster: block}: the one block under each heading of "Quick start"."""
    starts = {}
    for block in blocks(README):
        if len(block.headings) >= 3 and block.headings[1] == QUICK_START:
            cluster = block.headings[2]
            if cluster in starts:
                raise ValueError(f"README.md: the quick start {cluster!r} has more than one block")
            starts[cluster] = block
    return starts


def quick_start(cluster: str) -> Block:
    starts = quick_starts()
    if cluster not in starts:
        raise KeyError(f"README.md has no quick start {cluster!r} under {QUICK_START!r}: {sorted(starts)}")
    return starts[cluster]


@dataclass(frozen=True)
class SbatchLine:
    """`[VAR=value ...] sbatch [--option=value ...] SCRIPT [trainer flags ...]`, split as bash splits it."""

    env: dict
    options: tuple
    script: str
    args: tuple


def sbatch_lines(block: Block) -> list[SbatchLine]:
    """Each line of block that runs sbatch. Options must be written --name=value, as the docs write
    them, so that the script is the first word after sbatch that is not an option."""
    found = []
    for line in block.text.splitlines():
        words = shlex.split(line, comments=True)
        prefix = 0
        while prefix < len(words) and _ASSIGNMENT.match(words[prefix]):
            prefix += 1
        if words[prefix:prefix + 1] != ["sbatch"]:
            continue
        rest = words[prefix + 1:]
        at = next((i for i, word in enumerate(rest) if not word.startswith("-")), None)
        if at is None:
            raise ValueError(f"{block}: `{line}` names no job script")
        env = dict(word.split("=", 1) for word in words[:prefix])
        found.append(SbatchLine(env, tuple(rest[:at]), rest[at], tuple(rest[at + 1:])))
    return found


def quick_start_sbatch(cluster: str) -> SbatchLine:
    """The one sbatch line of cluster's quick start: what its twin submits."""
    block = quick_start(cluster)
    lines = sbatch_lines(block)
    if len(lines) != 1:
        raise ValueError(f"{block}: the {cluster} quick start has {len(lines)} sbatch lines, not one")
    return lines[0]


def twin_quick_start(twin_name: str) -> SbatchLine | None:
    """The sbatch line of the quick start whose cluster twin_name is the twin of, or None."""
    clusters = [cluster for cluster, twin in QUICK_START_TWINS.items() if twin == twin_name]
    return quick_start_sbatch(clusters[0]) if clusters else None


# The README's "Your own training script" quick starts: a block per scheduler, each under a heading of its
# own; the SLURM block has one sbatch line per cluster, which that cluster's twin submits word for word.
OWN_SCRIPT = "Your own training script"
OWN_SCRIPT_SLURM = "On a SLURM cluster"
OWN_SCRIPT_BY_HAND = "On one machine, and in Apptainer by hand"


def own_script_blocks(section: str) -> list[Block]:
    """The blocks under `section` of the README's own-script quick starts, in order."""
    return [block for block in blocks(README) if block.headings[1:3] == (OWN_SCRIPT, section)]


def own_script_sbatch(script: str) -> SbatchLine:
    """The own-script quick start's sbatch line that submits the job script `script`."""
    (block,) = own_script_blocks(OWN_SCRIPT_SLURM)
    found = [line for line in sbatch_lines(block) if line.script == script]
    if len(found) != 1:
        raise ValueError(f"{block}: {len(found)} sbatch lines submit {script}, not one")
    return found[0]


def own_script_apptainer_block() -> Block:
    """The own-script quick start that runs the image by hand with `apptainer run`."""
    (block,) = [block for block in own_script_blocks(OWN_SCRIPT_BY_HAND) if block.first_line.startswith("apptainer ")]
    return block


def own_script_job_script(twin_name: str) -> str:
    """The job script of twin_name's cluster that the own-script quick start submits (slurm/<cluster>-*.sh)."""
    (block,) = own_script_blocks(OWN_SCRIPT_SLURM)
    found = [line.script for line in sbatch_lines(block) if Path(line.script).name.startswith(f"{twin_name}-")]
    if len(found) != 1:
        raise ValueError(f"{block}: {len(found)} sbatch lines submit a job script of {twin_name}'s, not one")
    return found[0]
