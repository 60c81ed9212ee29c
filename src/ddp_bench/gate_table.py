"""The fabric gate's results beside the scaling table: one row per run from <run>/gate.json.

A run's bandwidth and verdict before training sit next to its images/s, so two runs compare on both
(a slow run on a slow fabric explains itself). Runs without gate.json (the gate skipped, or older
runs) get no row; with none at all there is no table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ddp_bench.errors import ReportError
from ddp_bench.markdown import titled_table
from ddp_train.gate.judge import GATE_JSON, human_size

HEADER = ("Run", "Gate", "Nodes", "Ranks", "Size", "busbw (GB/s)", "algbw (GB/s)", "#wrong", "Gate time (s)", "Named")


def gate_path(run: Path) -> Path:
    return (run if run.is_dir() else run.parent) / GATE_JSON


def gate_row(run: Path) -> tuple[str, ...] | None:
    path = gate_path(run)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        world = data["world"]
        largest = max(world["sizes"], key=lambda s: s["size_bytes"])
        return ((run if run.is_dir() else run.parent).name, "PASS" if data["ok"] else "FAIL", str(len(world["nodes"])),
                str(world["ranks"]), human_size(int(largest["size_bytes"])), f"{largest['busbw_gbps']:.3f}",
                f"{largest['algbw_gbps']:.3f}", str(sum(int(s["wrong"]) for s in world["sizes"])),
                f"{float(data['seconds']):.1f}", ", ".join(data.get("bad_nodes") or ()) or "-")
    except (ValueError, KeyError, TypeError) as exc:
        raise ReportError(f"{path} is not a fabric gate report ({exc!r}): remove it or rerun the gate") from None


def gate_table(runs: Sequence[Path]) -> str:
    """The Markdown table of the runs' gate results ("" when no run has one)."""
    rows = [row for row in (gate_row(run) for run in runs) if row is not None]
    return titled_table("Fabric gate (all-reduce before training; largest size, nccl-tests' busbw):", HEADER, rows)
