"""GPU sampler CSVs (slurm/gpu-sampler.sh: gpu-<node>.csv from nvidia-smi) to a summary.

Mean and min utilisation per GPU, in a Markdown table, plus a PNG of utilisation over
time; GPUs far below the busiest one are flagged (the "Unbalanced GPU Usage" symptom of
the MPCDF Raven tutorial: github.com/mvigl/MPCDF_tutorial, docs/05_multi_node.md).
"""

from __future__ import annotations

import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

from ddp_bench.errors import ReportError

UNBALANCED_FRACTION = 0.5  # a GPU below half the busiest GPU's mean is worth a look
TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


@dataclass(frozen=True)
class Sample:
    node: str
    index: int
    name: str
    time: datetime
    utilisation: float
    memory_used_mib: float


@dataclass(frozen=True)
class GpuSummary:
    node: str
    index: int
    name: str
    samples: int
    mean_utilisation: float
    min_utilisation: float
    max_memory_used_mib: float


def _number(text: str) -> float | None:
    text = text.strip().rstrip("%").replace("MiB", "").strip()
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _column(header: Sequence[str], prefix: str, path: Path) -> int:
    for i, name in enumerate(header):
        if name.strip().startswith(prefix):
            return i
    raise ReportError(f"{path}: no '{prefix}' column; write it with slurm/gpu-sampler.sh (nvidia-smi --format=csv)")


def read_csv(path: Path) -> list[Sample]:
    """One nvidia-smi CSV; the node is the file name's gpu-<node>.csv part."""
    node = path.stem[len("gpu-"):] if path.stem.startswith("gpu-") else path.stem
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, skipinitialspace=True))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ReportError(f"{path} is not an nvidia-smi CSV ({type(exc).__name__}); pass the gpu-<node>.csv "
                          f"files slurm/gpu-sampler.sh writes") from None
    except OSError as exc:
        raise ReportError(f"{path} cannot be read ({exc.strerror}); check its permissions") from None
    if not rows:
        return []
    header = rows[0]
    cols = {key: _column(header, key, path) for key in
            ("timestamp", "index", "name", "utilization.gpu", "memory.used")}
    samples = []
    for row in rows[1:]:
        if len(row) < len(header) or row[0] == header[0]:
            continue  # a cut-off last line, or a repeated header from a restarted sampler
        util = _number(row[cols["utilization.gpu"]])
        if util is None:
            continue
        try:
            when = datetime.strptime(row[cols["timestamp"]].strip(), TIME_FORMAT)
            index = int(row[cols["index"]])
        except ValueError:  # a garbled line: the sampler was killed mid-write
            continue
        samples.append(Sample(node, index, row[cols["name"]].strip(), when, util,
                              _number(row[cols["memory.used"]]) or 0.0))
    return samples


def csv_files(paths: Iterable[Path]) -> list[Path]:
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(path.glob("gpu-*.csv"))
        elif path.is_file():
            files.append(path)
        else:
            raise ReportError(f"{path} does not exist: pass gpu-<node>.csv files or the directory holding them")
    if not files:
        raise ReportError("no gpu-<node>.csv files found: was the job run where nvidia-smi exists? "
                          "(see the sampler-<node>.log files)")
    return files


def summarise_samples(samples: Iterable[Sample]) -> list[GpuSummary]:
    by_gpu: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for sample in samples:
        by_gpu[(sample.node, sample.index)].append(sample)
    return [GpuSummary(node, index, group[0].name, len(group),
                       sum(s.utilisation for s in group) / len(group),
                       min(s.utilisation for s in group),
                       max(s.memory_used_mib for s in group))
            for (node, index), group in sorted(by_gpu.items())]


def unbalanced(summaries: Sequence[GpuSummary]) -> list[GpuSummary]:
    if not summaries:
        return []
    busiest = max(s.mean_utilisation for s in summaries)
    return [s for s in summaries if s.mean_utilisation < UNBALANCED_FRACTION * busiest]


def markdown(summaries: Sequence[GpuSummary]) -> str:
    lines = ["| Node | GPU | Name | Samples | Mean util (%) | Min util (%) | Max memory (MiB) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {s.node} | {s.index} | {s.name} | {s.samples} | {s.mean_utilisation:.1f} | "
              f"{s.min_utilisation:.0f} | {s.max_memory_used_mib:.0f} |" for s in summaries]
    for s in unbalanced(summaries):
        lines.append(f"\nunbalanced GPU use: {s.node} GPU {s.index} averages {s.mean_utilisation:.0f}%, under "
                     f"half the busiest GPU (data loading or a slow node; see docs/troubleshooting.md)")
    return "\n".join(lines) + "\n"


def plot(samples: Sequence[Sample], path: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("ddp-bench: matplotlib is not installed; no PNG written", file=sys.stderr)
        return False
    start = min(s.time for s in samples)
    by_gpu: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for sample in samples:
        by_gpu[(sample.node, sample.index)].append(sample)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for (node, index), group in sorted(by_gpu.items()):
        ax.plot([(s.time - start).total_seconds() for s in group], [s.utilisation for s in group],
                label=f"{node} GPU {index}")
    ax.set(title="GPU utilisation", xlabel="seconds since first sample", ylabel="utilisation (%)", ylim=(0, 105))
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def summarise(paths: Sequence[Path], png: Path | None = None) -> str:
    files = csv_files(paths)
    samples = [sample for path in files for sample in read_csv(path)]
    if not samples:
        raise ReportError(f"{', '.join(map(str, files))}: no utilisation samples (only headers or N/A)")
    png = png or files[0].parent / "gpu-utilisation.png"
    if png.is_dir():  # matplotlib would write <dir>.png beside it instead
        raise ReportError(f"--png {png} is a directory: pass a file path such as {png / 'gpu-utilisation.png'}")
    try:
        written = plot(samples, png)
    except (OSError, ValueError) as exc:  # a directory, a missing parent, an unknown image suffix
        raise ReportError(f"--png {png} cannot be written ({getattr(exc, 'strerror', None) or exc}): "
                          f"pass a .png file path in a directory you can write") from None
    if written:
        print(f"written: {png}", file=sys.stderr)
    return markdown(summarise_samples(samples))
