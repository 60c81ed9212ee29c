"""Beside the scaling figures: each run's step time per rank, its stragglers, what ran, and what
differed between runs (the trainer's summary record and <run>/manifest.json)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from ddp_contract.provenance import MANIFEST_NAME, summary_lines


def _run_dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def load_manifest(run: Path) -> dict[str, Any] | None:
    try:
        return json.loads((_run_dir(run) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def flatten(manifest: dict[str, Any]) -> dict[str, str]:
    """The facts two runs are told apart by, one key each (pure)."""
    out = {"image": str(manifest["image"]["ids"]), "revision": str(manifest["image"].get("revision")),
           "torch": str(manifest.get("torch")), "host driver": str(manifest.get("host_driver")),
           "nodes": str(len(manifest.get("nodes", {}))), "world size": str(len(manifest.get("rank_map", {})))}
    for name, value in manifest["image"].get("labels", {}).items():
        out[f"label {name}"] = str(value)
    for label, libs in manifest.get("libraries", {}).items():
        out[f"library {label}"] = ", ".join(f"{lib['version']} {lib['path']}" for lib in libs)
    for name, item in manifest.get("environment", {}).items():
        out[f"env {name}"] = f"{item['value']} ({item['set_by'].split(':')[0]})"
    for name, value in manifest.get("config", {}).items():
        out[f"config {name}"] = str(value)
    return out


def differences(manifests: dict[str, dict[str, Any]]) -> list[str]:
    """'key: run a=x, run b=y' for every fact not the same in all runs (pure)."""
    flat = {name: flatten(m) for name, m in manifests.items()}
    keys = sorted(set().union(*flat.values())) if flat else []
    lines = []
    for key in keys:
        values = {name: facts.get(key, "(unset)") for name, facts in flat.items()}
        if len(set(values.values())) > 1:
            lines.append(f"{key}: " + "; ".join(f"{name}={value}" for name, value in values.items()))
    return lines


def section(runs: Sequence[tuple[str, Path, dict]]) -> str:
    """Markdown after the scaling table, from (name, run dir, summary record) per run."""
    out = ["", "## Step time per rank (median ms per step)", "",
           "| Run | Rank | Node | Step | Compute | Waiting in all-reduce |", "|---|---|---|---|---|---|"]
    stragglers = []
    for name, _path, summary in runs:
        for r in summary.get("step_times") or []:
            out.append(f"| {name} | {r['rank']} | {r['node']} | {r['step_ms']:.1f} | {r['compute_ms']:.1f} "
                       f"| {r['wait_ms']:.1f} |")
        for s in summary.get("stragglers") or []:
            stragglers.append(f"- {name}: straggler {s['who']}: {s['compute_ms']:.1f} ms compute per step, "
                              f"{s['over']:.0%} over the others' median {s['median_ms']:.1f} ms")
    out += ["", "Stragglers:" if stragglers else "Stragglers: none", *stragglers]
    manifests = {name: m for name, path, _ in runs if (m := load_manifest(path)) is not None}
    if manifests:
        out += ["", "## What ran", ""]
        for name, m in manifests.items():
            out += [f"{name}:", *(f"- {line}" for line in summary_lines(m))]
        if len(manifests) > 1:
            diff = differences(manifests)
            out += ["", "## What differed", "", *(f"- {line}" for line in diff or ["nothing recorded"])]
    return "\n".join(out) + "\n"


def plot_step_times(runs: Sequence[tuple[str, Path, dict]], path: Path) -> bool:
    """Median step time per epoch, one line per rank of each run."""
    series = [(name, r) for name, _, summary in runs for r in summary.get("step_times") or []]
    if not series:
        return False
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("ddp-bench: matplotlib is not installed; no step-time PNG written", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, r in series:
        per_epoch = r.get("step_ms_per_epoch") or []
        ax.plot(range(1, len(per_epoch) + 1), per_epoch, marker="o", label=f"{name} rank {r['rank']} ({r['node']})")
    ax.set(title="Step time per rank", xlabel="epoch", ylabel="median ms per step")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
