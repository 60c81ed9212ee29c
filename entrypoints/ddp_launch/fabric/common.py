"""Helpers shared by the fabric modules: defaults only where unset, and /sys probes under a root."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Mapping, Optional, Tuple

from ddp_launch.plan import EnvChange


def under(root: str, path: str) -> str:
    """path inside the probe root ("/" on a real node, a fake tree in tests)."""
    return os.path.join(root, path.lstrip("/"))


def list_dir(root: str, path: str) -> Optional[Tuple[str, ...]]:
    """Sorted entries of a directory, or None when it cannot be listed."""
    try:
        return tuple(sorted(os.listdir(under(root, path))))
    except OSError:
        return None


def read_text(root: str, path: str) -> Optional[str]:
    try:
        with open(under(root, path), encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


@dataclass
class EnvBuilder:
    """Collects changes for variables the user has not set; notes what was kept or skipped."""

    env: Mapping[str, str]
    changes: List[EnvChange] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def planned(self, name: str) -> Optional[str]:
        for change in reversed(self.changes):
            if change.name == name:
                return change.value
        return None

    def effective(self, name: str) -> Optional[str]:
        """The value the workload will see: the user's, else what we plan."""
        return self.env[name] if name in self.env else self.planned(name)

    def default(self, name: str, value: str, reason: str) -> bool:
        """Set name unless the user (or an earlier, more specific rule) already did."""
        if name in self.env:
            if self.env[name] != value:
                self.notes.append(f"kept your {name}={self.env[name]} (default would be {value}: {reason})")
            return False
        if self.planned(name) is not None:
            return False
        self.changes.append(EnvChange(name, value, reason))
        return True

    def force(self, name: str, value: str, reason: str) -> None:
        """Set name even if the environment has it (an explicit command-line choice)."""
        self.changes = [c for c in self.changes if c.name != name]
        self.changes.append(EnvChange(name, value, reason))
