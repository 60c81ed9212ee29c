"""The launch plan: what will be exec'd and which variables change, with why.

Built by pure functions, printed by --dry-run, executed last by cli.main.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ddp_launch.fabric import FabricPlan


@dataclass(frozen=True)
class EnvChange:
    """One environment variable the plan sets (value) or removes (value None)."""

    name: str
    value: str | None
    reason: str


@dataclass(frozen=True)
class Finding:
    """Something a plan noticed that a person should know, typed so doctor need not parse text.

    topic: what it is about ("kept" for a user value kept over a default, "interface",
    "route", "roce", "plugin", ...); severity: "info", "warning" or "error".
    """

    topic: str
    severity: str
    text: str


@dataclass(frozen=True)
class Endpoint:
    """Where the nodes meet: the rendezvous host (an address when it resolved) and its port."""

    host: str
    port: int | None    # None only inside torchrun when MASTER_PORT is unset
    address: str | None = None  # host's IPv4 address, when known: the fabric routes to it


@dataclass(frozen=True)
class LaunchPlan:
    """What will be exec'd, in what environment, and what the launch looks like to doctor and readers.

    env_changes and notes are the scheduler's; the fabric's come with `fabric`, and
    `changes` / `all_notes` are the two together, in the order they are applied and printed.
    """

    mode: str
    argv: tuple[str, ...]
    env_changes: tuple[EnvChange, ...] = ()
    notes: tuple[str, ...] = ()
    nodes: int = 1
    rendezvous: Endpoint | None = None      # None: torchrun --standalone picks its own port
    fabric: FabricPlan | None = None
    # One line for the job's output, printed before exec by the node (or rank) that hosts the
    # rendezvous only: which node is the head and at what address, as job scripts echo it.
    announcement: str | None = None

    @property
    def changes(self) -> tuple[EnvChange, ...]:
        return self.env_changes + (self.fabric.changes if self.fabric is not None else ())

    @property
    def all_notes(self) -> tuple[str, ...]:
        return self.notes + (tuple(self.fabric.notes) if self.fabric is not None else ())

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The full environment for exec: base with this plan's changes applied."""
        env = dict(base)
        for change in self.changes:
            if change.value is None:
                env.pop(change.name, None)
            else:
                env[change.name] = change.value
        return env

    def render_text(self) -> str:
        lines = [f"mode: {self.mode}", f"command: {shlex.join(self.argv)}"]
        if self.changes:
            lines.append("environment:")
            for change in self.changes:
                shown = "(unset)" if change.value is None else shlex.quote(change.value)
                lines.append(f"  {change.name}={shown}  # {change.reason}")
        lines.extend(f"note: {note}" for note in self.all_notes)
        return "\n".join(lines)

    def render_json(self) -> str:
        return json.dumps(
            {
                "mode": self.mode,
                "argv": list(self.argv),
                "env": [
                    {"name": c.name, "value": c.value, "reason": c.reason}
                    for c in self.changes
                ],
                "notes": list(self.all_notes),
                "nodes": self.nodes,
                "rendezvous": None if self.rendezvous is None else {
                    "host": self.rendezvous.host, "port": self.rendezvous.port},
                "fabric": None if self.fabric is None else self.fabric.fabric,
            },
            indent=2,
        )
