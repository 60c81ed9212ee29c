"""Beside the scaling table: each time a run put a spare node in a bad node's place, from its
"recovery" records (src/ddp_train/recovery.py): who was replaced, by which spare, what named it,
and the seconds from the fault to training again with their parts. No recovery, no table.
"""

from __future__ import annotations

from typing import Sequence

from ddp_bench.errors import ReportError
from ddp_bench.markdown import titled_table

HEADER = ("Run", "Replaced", "By spare", "Named by", "Fault to training (s)", "Parts (s)")


def recovery_rows(name: str, records: Sequence[dict]) -> list[tuple[str, ...]]:
    rows = []
    for record in records:
        if record.get("type") != "recovery":
            continue
        try:
            swaps = record["swaps"]
            seconds = record.get("seconds")
            parts = ", ".join(f"{part} {float(value):.1f}" for part, value in (record.get("parts") or {}).items())
            rows.append((name, ", ".join(s["node"] for s in swaps), ", ".join(s["spare"] for s in swaps),
                         ", ".join(s["by"] for s in swaps), "-" if seconds is None else f"{float(seconds):.1f}",
                         parts or "-"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ReportError(f"run {name}: a malformed recovery record ({exc!r}); pass metrics.jsonl files "
                              f"written by ddp-train") from None
    return rows


def recovery_table(runs: Sequence[tuple[str, Sequence[dict]]]) -> str:
    """The Markdown table of the runs' recoveries, from (name, metrics records) per run ("" when none)."""
    rows = [row for name, records in runs for row in recovery_rows(name, records)]
    return titled_table("Recoveries (a spare node in a bad node's place, inside the allocation):", HEADER, rows)
