"""The launch plan: what will be exec'd and which variables change, with why.

Built by pure functions, printed by --dry-run, executed last by cli.main.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

# Who set a variable, for the run's manifest (forensics.env_sources).
LAUNCHER = "launcher"               # the scheduler's plan and ours
FABRIC_DEFAULT = "fabric default"   # containers/sites/fabrics/*.json and the fabric's rules
SITE_PROFILE = "site profile"       # containers/sites/<site>.json


@dataclass(frozen=True)
class EnvChange:
    """One environment variable the plan sets (value) or removes (value None), why, and who set it."""

    name: str
    value: str | None
    reason: str
    origin: str = LAUNCHER


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
    here: bool | None = None    # whether this node hosts it (None: torchrun tells, by its own addresses)


@dataclass(frozen=True)
class LaunchPlan:
    """What will be exec'd, in what environment, and what the launch looks like to doctor and readers.

    changes and notes are in the order they are applied and printed: the scheduler's, then the
    fabric's (each change says who set it); findings are the fabric's, typed for doctor.
    """

    mode: str
    argv: tuple[str, ...]
    changes: tuple[EnvChange, ...] = ()
    notes: tuple[str, ...] = ()
    nodes: int = 1
    rendezvous: Endpoint | None = None      # None: torchrun --standalone picks its own port
    fabric: str | None = None               # slingshot | infiniband | ethernet; None: not planned yet
    findings: tuple[Finding, ...] = ()
    # One line for the job's output, printed before exec by the node (or rank) that hosts the
    # rendezvous only: which node is the head and at what address, as job scripts echo it. A pod has a
    # log of its own, so every other pod says what it joins too (schedulers/kubeflow.py).
    announcement: str | None = None
    min_nodes: int | None = None            # an elastic job's fewest nodes (--nnodes=MIN:MAX; nodes is MAX)

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
        lines.extend(f"note: {note}" for note in self.notes)
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
                "notes": list(self.notes),
                "nodes": self.nodes,
                "rendezvous": None if self.rendezvous is None else {
                    "host": self.rendezvous.host, "port": self.rendezvous.port},
                "fabric": self.fabric,
            },
            indent=2,
        )
