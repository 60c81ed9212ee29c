"""EnvBuilder, shared by the fabric modules: a default only where nothing set the variable yet,
and a typed finding for each value of the user's that was kept over a default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ddp_launch.plan import FABRIC_DEFAULT, EnvChange, Finding


@dataclass
class EnvBuilder:
    """Collects changes for variables the user has not set, and findings for --dry-run and doctor."""

    env: Mapping[str, str]
    changes: list[EnvChange] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def planned(self, name: str) -> str | None:
        for change in reversed(self.changes):
            if change.name == name:
                return change.value
        return None

    def note(self, topic: str, severity: str, text: str) -> None:
        self.findings.append(Finding(topic, severity, text))

    def default(self, name: str, value: str, reason: str, origin: str = FABRIC_DEFAULT) -> bool:
        """Set name unless the user (or an earlier, more specific rule) already did."""
        if name in self.env:
            if self.env[name] != value:
                self.note("kept", "info", f"kept your {name}={self.env[name]} (default would be {value}: {reason})")
            return False
        if self.planned(name) is not None:
            return False
        self.changes.append(EnvChange(name, value, reason, origin))
        return True

    def force(self, name: str, value: str, reason: str) -> None:
        """Set name even if the environment has it (an explicit command-line choice)."""
        self.changes = [c for c in self.changes if c.name != name]
        self.changes.append(EnvChange(name, value, reason, FABRIC_DEFAULT))
