"""The launch plan: what will be exec'd and which variables change, with why.

Built by pure functions, printed by --dry-run, executed last by cli.main.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field


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
class Topology:
    """What the fabric settings need to know about the launch: node count and head."""

    nodes: int
    head_address: str | None = None


@dataclass(frozen=True)
class LaunchPlan:
    mode: str
    argv: tuple[str, ...]
    env_changes: tuple[EnvChange, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def with_env(self, changes: tuple[EnvChange, ...], notes: tuple[str, ...] = ()) -> "LaunchPlan":
        """This plan with more environment changes and notes appended (e.g. the fabric's)."""
        return LaunchPlan(self.mode, self.argv, self.env_changes + tuple(changes),
                          self.notes + tuple(notes))

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The full environment for exec: base with this plan's changes applied."""
        env = dict(base)
        for change in self.env_changes:
            if change.value is None:
                env.pop(change.name, None)
            else:
                env[change.name] = change.value
        return env

    def render_text(self) -> str:
        lines = [f"mode: {self.mode}", f"command: {shlex.join(self.argv)}"]
        if self.env_changes:
            lines.append("environment:")
            for change in self.env_changes:
                shown = "(unset)" if change.value is None else shlex.quote(change.value)
                lines.append(f"  {change.name}={shown}  # {change.reason}")
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)

    def render_json(self) -> str:
        import json  # only --dry-run --json needs it; the launcher's start-up time is measured

        return json.dumps(
            {
                "mode": self.mode,
                "argv": list(self.argv),
                "env": [
                    {"name": c.name, "value": c.value, "reason": c.reason}
                    for c in self.env_changes
                ],
                "notes": list(self.notes),
            },
            indent=2,
        )
