"""The scaling table of the MPCDF Raven multi-node tutorial from the trainer's metrics:
`ddp-bench report RUN_DIR...` (the tutorial: github.com/mvigl/MPCDF_tutorial, docs/05_multi_node.md,
"Benchmarking All Configurations").

Reads <run>/metrics.jsonl of several runs (1 GPU, 1 node, N nodes), and makes the table
(configuration, time, images/s, speedup and efficiency against the smallest run) as
Markdown, CSV and a PNG.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ddp_bench import run_facts
from ddp_bench.errors import ReportError
from ddp_bench.gate_table import gate_table
from ddp_bench.markdown import table_lines
from ddp_bench.recoveries import recovery_table
from ddp_train.metrics import METRICS_NAME


@dataclass(frozen=True)
class EpochPoint:
    epoch: int
    images_per_s: float
    val_accuracy: float
    warm_up: bool = False  # the first epoch of a process start: not steady state


@dataclass(frozen=True)
class RunResult:
    name: str
    device: str
    nodes: int
    world_size: int
    total_time_s: float
    images_per_s: float
    final_accuracy: float
    epochs: tuple[EpochPoint, ...]
    data_generated_in: str = ""  # --demo generated its data here, for want of CIFAR-100

    @property
    def configuration(self) -> str:
        unit, units = ("GPU", "GPUs") if self.device == "cuda" else ("process", "processes")
        if self.world_size == 1:
            return f"Single {unit}"
        if self.nodes == 1:
            return f"Multi-{unit} ({self.world_size} {units}, 1 node)"
        return f"Multi-Node ({self.world_size} {units}, {self.nodes} nodes)"


@dataclass(frozen=True)
class Row:
    run: RunResult
    speedup: float
    efficiency: float


def load_run(run_dir: Path) -> RunResult:
    path = run_dir / METRICS_NAME if run_dir.is_dir() else run_dir
    if not path.is_file():
        raise ReportError(f"{path} not found: pass run directories written by ddp-train --run-dir")
    records = read_records(path)
    runs = [r for r in records if r.get("type") == "run"]
    summaries = [r for r in records if r.get("type") == "summary"]
    if not summaries:
        raise ReportError(f"{path} has no summary record: the run did not finish; resume it or leave it out")
    summary, meta = summaries[-1], (runs[-1] if runs else {})
    try:
        result = _run_result(run_dir, records, summary, meta)
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        what = f"no {exc.args[0]!r} field" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise ReportError(f"{path}: a malformed record ({what}); pass metrics.jsonl files written "
                          f"by ddp-train") from None
    if result.world_size < 1 or result.nodes < 1:
        raise ReportError(f"{path}: the summary says {result.world_size} processes on {result.nodes} "
                          f"nodes; pass metrics.jsonl files written by ddp-train")
    return result


def _last_summary(run_dir: Path) -> dict:
    path = run_dir / METRICS_NAME if run_dir.is_dir() else run_dir
    return [r for r in read_records(path) if r.get("type") == "summary"][-1]


def read_records(path: Path) -> list[dict]:
    """metrics.jsonl's records; a cut-off last line (a run killed mid-write) is left out."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ReportError(f"{path} is not UTF-8 text; pass metrics.jsonl files written by ddp-train") from None
    except OSError as exc:
        raise ReportError(f"{path} cannot be read ({exc.strerror}); check its permissions") from None
    lines = text.splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines) and not text.endswith("\n"):
                continue
            raise ReportError(f"{path} line {number}: not JSON ({exc.msg}); is this a metrics file?") from None
        if not isinstance(record, dict):
            raise ReportError(f"{path} line {number}: not a JSON object; is this a metrics file?")
        records.append(record)
    return records


def _run_result(run_dir: Path, records: list[dict], summary: dict, meta: dict) -> RunResult:
    epochs = tuple(EpochPoint(int(r["epoch"]), float(r["images_per_s"]), float(r["val_accuracy"]),
                              bool(r.get("warm_up_epoch", False)))
                   for r in records if r.get("type") == "epoch")
    return RunResult(
        name=(run_dir if run_dir.is_dir() else run_dir.parent).name,
        device=str(meta.get("device", "cuda")),
        nodes=int(summary["nodes"]),
        world_size=int(summary["world_size"]),
        total_time_s=float(summary["total_time_s"]),
        # The steady figure (first epoch of each start excluded); older runs have only the overall one.
        images_per_s=float(summary.get("steady_images_per_s", summary["images_per_s"])),
        final_accuracy=float(summary["final_accuracy"]),
        epochs=epochs,
        data_generated_in=str(meta.get("data_generated_in") or ""),
    )


def scaling_rows(runs: Sequence[RunResult]) -> list[Row]:
    """Speedup is throughput against the smallest run, so runs that stopped early compare fairly."""
    ordered = sorted(runs, key=lambda r: (r.world_size, r.nodes, r.name))
    base = ordered[0]
    rows = []
    for run in ordered:
        speedup = run.images_per_s / base.images_per_s if base.images_per_s else 0.0
        rows.append(Row(run, speedup, speedup / (run.world_size / base.world_size)))
    return rows


HEADER = ("Configuration", "Run", "Time (s)", "Images/s", "Speedup", "Efficiency", "Accuracy")


def _cells(row: Row) -> tuple[str, ...]:
    run = row.run
    return (run.configuration, run.name, f"{run.total_time_s:.2f}", f"{run.images_per_s:.1f}",
            f"{row.speedup:.2f}x", f"{row.efficiency * 100:.0f}%", f"{run.final_accuracy:.4f}")


def markdown_table(rows: Sequence[Row]) -> str:
    return "\n".join(table_lines(HEADER, [_cells(row) for row in rows])) + "\n"


def csv_table(rows: Sequence[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["configuration", "run", "nodes", "world_size", "time_s", "images_per_s",
                     "speedup", "efficiency", "final_accuracy"])
    for row in rows:
        run = row.run
        writer.writerow([run.configuration, run.name, run.nodes, run.world_size, f"{run.total_time_s:.3f}",
                         f"{run.images_per_s:.3f}", f"{row.speedup:.4f}", f"{row.efficiency:.4f}",
                         f"{run.final_accuracy:.4f}"])
    return out.getvalue()


def plot(rows: Sequence[Row], path: Path) -> bool:
    """Throughput and accuracy per epoch, speedup against GPUs with the ideal line."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("ddp-bench: matplotlib is not installed; no PNG written (pip install matplotlib)", file=sys.stderr)
        return False
    fig, (ax_tp, ax_acc, ax_sp) = plt.subplots(1, 3, figsize=(15, 4.5))
    for row in rows:
        epochs = [p.epoch for p in row.run.epochs]
        label = f"{row.run.configuration} [{row.run.name}]"
        steady = [p for p in row.run.epochs if not p.warm_up]  # the table's figure: steady epochs
        ax_tp.plot([p.epoch for p in steady], [p.images_per_s for p in steady], marker="o", label=label)
        ax_acc.plot(epochs, [p.val_accuracy for p in row.run.epochs], marker="o", label=label)
    ax_tp.set(title="Throughput (steady epochs)", xlabel="epoch", ylabel="images/s")
    ax_acc.set(title="Validation accuracy", xlabel="epoch", ylabel="accuracy")
    ax_tp.legend(fontsize="small")
    base_world = rows[0].run.world_size
    worlds = [row.run.world_size for row in rows]
    ax_sp.plot(worlds, [row.speedup for row in rows], marker="o", label="measured")
    ax_sp.plot(worlds, [w / base_world for w in worlds], linestyle="--", color="grey", label="ideal")
    ax_sp.set(title="Speedup", xlabel="GPUs (world size)", ylabel=f"x over {base_world}")
    ax_sp.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


@dataclass(frozen=True)
class Report:
    table: str            # report.md's text
    written: tuple        # the files written, report.md first
    notes: tuple          # what a reader of the figures must know first (a run on generated data)


def data_notes(runs: Sequence[RunResult]) -> tuple[str, ...]:
    """One line per run that trained on --demo's generated data: its accuracy is not CIFAR-100's."""
    return tuple(f"{run.name} trained on generated data in CIFAR-100's format ({run.data_generated_in}), not on "
                 f"CIFAR-100: its accuracy says how well the model learns that set; `make data` fetches CIFAR-100"
                 for run in runs if run.data_generated_in)


def report(run_dirs: Sequence[Path], out_dir: Path) -> Report:
    runs = [load_run(path) for path in run_dirs]
    rows = scaling_rows(runs)
    notes = data_notes(runs)
    # Beside the figures: the fabric gate's results (gate_table.py), the spares that took bad nodes'
    # places (recoveries.py), step time per rank, stragglers, what ran and what differed (run_facts.py).
    facts = [(load_run(path).name, path, _last_summary(path)) for path in run_dirs]
    recovered = [(name, read_records(path / METRICS_NAME if path.is_dir() else path)) for name, path, _ in facts]
    table = (markdown_table(rows) + "".join(f"\nNote: {note}\n" for note in notes) + gate_table(run_dirs)
             + recovery_table(recovered) + run_facts.section(facts))
    written = [out_dir / "report.md", out_dir / "report.csv"]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written[0].write_text(table, encoding="utf-8")
        written[1].write_text(csv_table(rows), encoding="utf-8")
        if plot(rows, out_dir / "report.png"):
            written.append(out_dir / "report.png")
        if run_facts.plot_step_times(facts, out_dir / "step-times.png"):
            written.append(out_dir / "step-times.png")
    except OSError as exc:
        raise ReportError(f"--out {out_dir} cannot be written ({exc.strerror}): pass a directory "
                          f"you can write") from None
    return Report(table, tuple(written), notes)
