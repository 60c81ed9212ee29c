"""What a doctor check returns and how the report prints it: a line per check with its fix,
or JSON for machines (ddp_contract.quarantine reads its FAILs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""
    evidence: str = ""      # what a tool printed about the failure, for the site's support (JSON only)


def any_failed(checks: Sequence[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


def render_text(checks: Sequence[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{check.status:<4}  {check.name}: {check.detail}")
        if check.fix and check.status != "OK":
            lines.append(f"      fix: {check.fix}")
    failed = sum(c.status == FAIL for c in checks)
    lines.append(f"doctor: {failed} failed" if failed else "doctor: no failures")
    return "\n".join(lines)


def render_json(checks: Sequence[Check]) -> str:
    return json.dumps(
        {"ok": not any_failed(checks),
         "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix,
                     **({"evidence": c.evidence} if c.evidence else {})} for c in checks]},
        indent=2,
    )
