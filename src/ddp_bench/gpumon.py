"""GPU sampler CSVs (slurm/gpu-sampler.sh: gpu-<node>.csv from nvidia-smi or rocm-smi) to a summary.

Which column holds what is each vendor's data (containers/sites/accelerators/<vendor>.json,
"sampler.columns"); a CSV is read with the vendor whose utilisation column its header has.

Mean and min utilisation per GPU, in a Markdown table, plus a PNG of utilisation over
time; GPUs far below the busiest one are flagged (the "Unbalanced GPU Usage" symptom of
the MPCDF Raven tutorial: github.com/mvigl/MPCDF_tutorial, docs/05_multi_node.md).
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

from ddp_bench.errors import ReportError
from ddp_launch.accelerators import ACCELERATORS, Sampler, load_accelerator
from ddp_launch.errors import LaunchError

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


def _find_column(header: Sequence[str], prefix: str) -> int | None:
    """nvidia-smi adds the unit to the name ("utilization.gpu [%]"), so a column is found by its start."""
    return next((i for i, name in enumerate(header) if name.strip().startswith(prefix)), None)


def _column(header: Sequence[str], prefix: str, path: Path) -> int:
    found = _find_column(header, prefix)
    if found is None:
        raise ReportError(f"{path}: no '{prefix}' column; write it with slurm/gpu-sampler.sh (nvidia-smi --format=csv)")
    return found


def samplers() -> dict[str, Sampler]:
    """Each vendor's sampler, by vendor name (the data files beside the site profiles)."""
    try:
        return {name: load_accelerator(name, {}).sampler for name in ACCELERATORS}
    except LaunchError as error:
        raise ReportError(str(error)) from None


def sampler_of(header: Sequence[str], path: Path) -> Sampler:
    """The vendor's sampler whose utilisation column the header has (nvidia-smi when none does)."""
    known = samplers()
    for sampler in known.values():
        if _find_column(header, sampler.columns["utilization"]) is not None:
            return sampler
    return known[ACCELERATORS[0]]


def _index(text: str) -> int:
    """The GPU's number: nvidia-smi's index ("0"), rocm-smi's device ("card0")."""
    digits = re.fullmatch(r"\s*(?:card)?(\d+)\s*", text)
    if digits is None:
        raise ValueError(text)
    return int(digits.group(1))


def read_csv(path: Path) -> list[Sample]:
    """One sampler CSV (nvidia-smi's, or rocm-smi's with the sampler's timestamp column); the node
    is the file name's gpu-<node>.csv part."""
    node = path.stem[len("gpu-"):] if path.stem.startswith("gpu-") else path.stem
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, skipinitialspace=True))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise ReportError(f"{path} is not a GPU sampler CSV ({type(exc).__name__}); pass the gpu-<node>.csv "
                          f"files slurm/gpu-sampler.sh writes") from None
    except OSError as exc:
        raise ReportError(f"{path} cannot be read ({exc.strerror}); check its permissions") from None
    if not rows:
        return []
    header = rows[0]
    sampler = sampler_of(header, path)
    cols = {key: _column(header, column, path) for key, column in sampler.columns.items()}
    mib_per_unit = sampler.memory_unit_bytes / 2**20
    samples = []
    for row in rows[1:]:
        if len(row) < len(header) or row[0] == header[0]:
            continue  # a cut-off last line, or a repeated header from a restarted sampler
        util = _number(row[cols["utilization"]])
        if util is None:
            continue
        try:
            when = datetime.strptime(row[cols["timestamp"]].strip(), TIME_FORMAT)
            index = _index(row[cols["index"]])
        except ValueError:  # a garbled line: the sampler was killed mid-write
            continue
        samples.append(Sample(node, index, row[cols["name"]].strip(), when, util,
                              (_number(row[cols["memory_used"]]) or 0.0) * mib_per_unit))
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
        raise ReportError("no gpu-<node>.csv files found: was the job run where nvidia-smi (rocm-smi on AMD) exists? "
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
