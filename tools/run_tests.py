"""`make test`'s suites, with the wall time and the CPU-seconds each one took.

The unit suite runs first, on two processes, with the bats suite beside it; then the e2e suite on
--e2e-workers clusters side by side. Every suite runs whatever another one said; the failures of all
three are named again at the end (a CI log's tail must name them), then the time and CPU lines, and
the last line is the verdict.

Wall time alone does not compare across machines: the suite is bound by CPU, and machines of one kind
differ by 1.5x in it. So each phase also says the CPU-seconds the machine spent (/proc/stat, proc(5):
every process, another user's too) and those this run's own processes spent, SLURM's daemons and the
jobs they start included (a cgroup of the run's own, tools/cpu_usage.py), and the whole run is also
counted in units of one `import torch` on this machine, measured at the start: a run's figure in
those units is about the same on a slow machine and a fast one (docs/testing.md, the budget). The
last lines before the verdict name each pytest suite's heaviest tests and shared fixtures in CPU-seconds
(tests/cpu_accounting.py), so that a new test's cost is seen where the run's is.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import cpu_usage  # tools/cpu_usage.py, beside this file

# `make test` writes this first (the suite-clock target), before its venv, lint and images: the cold
# run's start, in the format clock_line() writes.
CLOCK_FILE = Path(".suite-clock")  # in the checkout, where make runs
TOP_COSTS = 12  # the heaviest tests and shared fixtures of each pytest suite named at the end
WORLD = "tests/e2e/world.py"
WORLD_TAIL = 20  # lines of its log shown: its verdicts, or the steps before its failure
# `make test` starts the e2e world once its Debian packages are in (the world-ahead target), while pip
# fills the venv on one core; the runner's own start of it below then waits on the world's locks.
WORLD_AHEAD_LOG = Path(".world-ahead.log")  # in the checkout, where make runs


@dataclass(frozen=True)
class Reading:
    """When, and how much CPU the machine and this run's own processes had spent."""
    wall_s: float
    machine_cpu_s: float
    own_cpu_s: float


def machine_cpu_s(stat_text: str, ticks_per_s: int) -> float:
    """The CPU time all CPUs spent busy since boot, from /proc/stat's first line ("cpu user nice system
    idle iowait irq softirq steal guest guest_nice", in USER_HZ ticks, proc(5)): everything but idle and
    iowait. guest and guest_nice are already counted in user and nice, so they are left out."""
    fields = stat_text.splitlines()[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"/proc/stat's first line is not the CPUs' total: {stat_text.splitlines()[0]!r}")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in (fields[1:9] + ["0"] * 8)[:8])
    return (user + nice + system + irq + softirq + steal) / ticks_per_s


def read_clock(own=None) -> Reading:
    """Now: the machine's CPU time, and own's reading (a tools/cpu_usage.py meter; by default this
    process's waited-for children)."""
    if own is None:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        own_s = children.ru_utime + children.ru_stime
    else:
        own_s = own.read()
    return Reading(time.time(), machine_cpu_s(Path("/proc/stat").read_text(), os.sysconf("SC_CLK_TCK")), own_s)


def clock_line(reading: Reading) -> str:
    return f"{reading.wall_s:.3f} {reading.machine_cpu_s:.2f}\n"


def parse_clock_line(text: str) -> Optional[Reading]:
    words = text.split()
    if len(words) != 2:
        return None
    try:
        return Reading(float(words[0]), float(words[1]), 0.0)
    except ValueError:
        return None


# Where the suites' per-test CPU-seconds (tests/cpu_accounting.py's JSON) are kept after the run, if set: the
# whole list, where the run's output names the heaviest alone.
KEEP_REPORTS_VAR = "DDP_TEST_CPU_REPORTS"


def keep_reports(logs: Path, directory: str) -> list[Path]:
    """The suites' per-test CPU reports copied from the run's logs into directory (made if missing); none
    where directory is empty."""
    if not directory:
        return []
    kept = []
    Path(directory).mkdir(parents=True, exist_ok=True)
    for name in ("unit.json", "e2e.json"):
        if (logs / name).is_file():
            kept.append(Path(shutil.copy(logs / name, Path(directory) / name)))
    return kept


def torch_import_cpu_s(python: str, tries: int = 2) -> float:
    """The CPU-seconds of `import torch` in a new interpreter (the least of `tries`: the first may read
    the files from disk): the unit the budget is stated in."""
    best = float("inf")
    for _ in range(tries):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([python, "-c", "import torch"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return best


@dataclass(frozen=True)
class Phase:
    name: str
    wall_s: float
    machine_cpu_s: float
    own_cpu_s: float       # this run's processes (with SLURM's jobs where a cgroup counts them)

    @staticmethod
    def between(name: str, start: Reading, end: Reading) -> "Phase":
        return Phase(name, end.wall_s - start.wall_s, end.machine_cpu_s - start.machine_cpu_s,
                     end.own_cpu_s - start.own_cpu_s)


def phase_line(phase: Phase, import_s: float) -> str:
    return (f"time: {phase.name}: {phase.wall_s / 60:.1f} min, its processes {phase.own_cpu_s:,.0f} CPU-s "
            f"= {phase.own_cpu_s / import_s:,.0f} torch imports (the machine's {phase.machine_cpu_s:,.0f} CPU-s)")


def budget_unit(readings: Sequence[float]) -> float:
    """The unit of the budget from the run's readings of `import torch`: the least. A reading taken while
    other work shares the cores (the e2e world's build, started ahead, at the run's start) reads high on
    a virtual machine's shared cores, never low; the end of the run has the machine to itself."""
    return min(readings)


def summary_lines(phases: Sequence[Phase], import_s: float, whole: Optional[Phase], own_source: str = "",
                  readings: Sequence[float] = ()) -> list[str]:
    said = f"the least of its readings at the run's start and end, {' and '.join(f'{r:.2f}' for r in readings)}: " \
        if len(readings) > 1 else ""
    lines = [f"time: one `import torch` here: {import_s:.2f} CPU-s ({said}the unit of the budget, docs/testing.md)"]
    if own_source:
        lines.append(f"time: a phase's processes counted by {own_source}; the machine's: /proc/stat, every user's")
    lines += [phase_line(phase, import_s) for phase in phases]
    if whole is not None:
        lines.append(f"time: make test, from its start (venv, lint, images included): {whole.wall_s / 60:.1f} min, "
                     f"the machine's {whole.machine_cpu_s:,.0f} CPU-s = {whole.machine_cpu_s / import_s:,.0f} torch imports")
    return lines


def world_lines(log: str) -> str:
    """The world's verdict lines, or the end of its log where it stopped without one (a traceback)."""
    verdicts = [line for line in log.splitlines() if line.startswith("e2e world: ")]
    return "\n".join(verdicts or log.splitlines()[-WORLD_TAIL:] or ["(it printed nothing)"])


def run_teed(argv: Sequence[str], log: Path) -> int:
    """argv's output to the console and to log, as `| tee` would; its exit status."""
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            out.write(line)
        return proc.wait()


def failures(unit_log: str, bats_log: str, e2e_log: str, e2e_setup: str = "") -> list[str]:
    """The failed tests' lines, and the e2e world's setup failure (tests/e2e/conftest.py, setup_failed),
    which stops every e2e test at once."""
    pytest_failed = [line for text in (unit_log, e2e_log) for line in text.splitlines()
                     if line.startswith(("FAILED ", "ERROR "))]
    return (e2e_setup.splitlines() + pytest_failed
            + [line for line in bats_log.splitlines() if line.startswith("not ok ")])


def start_world_ahead(python: str) -> subprocess.Popen:
    """tests/e2e/world.py started in a session of its own, its output in WORLD_AHEAD_LOG; not waited for.
    Its parts are cached and built under locks (tests/e2e/world.py), so the runner's own start of it later
    finds them built or waits for this one: a failure here is tried again there, and said there."""
    with open(WORLD_AHEAD_LOG, "w", encoding="utf-8") as log:
        return subprocess.Popen([python, WORLD], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def verdict(code: int) -> str:
    return "passed" if code == 0 else "FAILED"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/run_tests.py", description=__doc__.splitlines()[0])
    parser.add_argument("--e2e-workers", type=int, default=3, help="clusters side by side (1: one, no xdist)")
    parser.add_argument("--mark-start", action="store_true", help=f"write {CLOCK_FILE.name}, the run's start, and stop")
    parser.add_argument("--start-world", action="store_true",
                        help=f"start {WORLD} in the background (its log: {WORLD_AHEAD_LOG.name}) and stop")
    args = parser.parse_args(argv)
    if args.mark_start:
        CLOCK_FILE.write_text(clock_line(read_clock()))
        return 0
    if args.start_world:
        start_world_ahead(sys.executable)
        print(f"e2e world: started ahead, beside the venv's pip (log: {WORLD_AHEAD_LOG})", flush=True)
        return 0
    python = sys.executable
    own = cpu_usage.meter("make-test")
    import_s = torch_import_cpu_s(python)
    # The pytest suites' own summaries say their CPU-seconds in these units too (tests/cpu_accounting.py).
    os.environ["DDP_TORCH_IMPORT_CPU_S"] = f"{import_s:.3f}"

    with tempfile.TemporaryDirectory(prefix="make-test-") as tmp:
        logs = Path(tmp)
        started = read_clock(own)
        with open(logs / "bats", "w", encoding="utf-8") as bats_out, \
                open(logs / "world", "w", encoding="utf-8") as world_out:
            # The e2e world's downloads and unpacking (tests/e2e/world.py) fill the cores the unit suite
            # leaves idle, instead of idling one ahead of the e2e session.
            world = subprocess.Popen([python, WORLD], stdout=world_out, stderr=subprocess.STDOUT)
            bats = subprocess.Popen(["bats", "--recursive", "tests/bats"], stdout=bats_out, stderr=subprocess.STDOUT)
            unit = run_teed([python, "-m", "pytest", "-q", "-n", "2", "--durations=10", "--cpu-top=0",
                             f"--cpu-report={logs / 'unit.json'}", "tests/unit"], logs / "unit")
            bats_code = bats.wait()
            world.wait()
        print("--- tests/bats, run beside tests/unit ---")
        print((logs / "bats").read_text(encoding="utf-8"), end="", flush=True)
        print("--- the e2e world, built beside tests/unit (tests/e2e/world.py) ---")
        print(world_lines((logs / "world").read_text(encoding="utf-8")), flush=True)
        unit_done = read_clock(own)

        workers = ["-n", str(args.e2e_workers), "--dist", "loadscope"] if args.e2e_workers > 1 else []
        setup_note = logs / "e2e-setup"
        setup_note.touch()
        os.environ["DDP_E2E_SETUP_NOTE"] = str(setup_note)  # tests/e2e/conftest.py, SETUP_NOTE_VAR
        e2e = run_teed([python, "-m", "pytest", *workers, "-v", "--durations=0", "--durations-min=20", "--cpu-top=0",
                        f"--cpu-report={logs / 'e2e.json'}", "tests/e2e"], logs / "e2e")
        e2e_done = read_clock(own)
        own.close()
        readings = (import_s, torch_import_cpu_s(python))
        import_s = budget_unit(readings)
        texts = {name: (logs / name).read_text(encoding="utf-8") for name in ("unit", "bats", "e2e", "e2e-setup")}
        ledgers = [cpu_usage.read_ledger(logs / f"{name}.json") for name in ("unit", "e2e")]
        kept = keep_reports(logs, os.environ.get(KEEP_REPORTS_VAR, ""))

    print("--- what failed (the whole reports are above) ---")
    for line in failures(texts["unit"], texts["bats"], texts["e2e"], texts["e2e-setup"]):
        print(line)
    for name in ("unit", "e2e"):
        tail = texts[name].splitlines()[-1:] or [f"(tests/{name} printed nothing)"]
        print(tail[0])
    for ledger in ledgers:
        for line in cpu_usage.ledger_lines(ledger, TOP_COSTS, import_s) if ledger else []:
            print(line)
    begun = parse_clock_line(CLOCK_FILE.read_text()) if CLOCK_FILE.exists() else None
    whole = Phase.between("make test", begun, e2e_done) if begun else None
    phases = [Phase.between("tests/unit with tests/bats and the e2e world beside it", started, unit_done),
              Phase.between("tests/e2e", unit_done, e2e_done)]
    for line in summary_lines(phases, import_s, whole, own.source, readings):
        print(line)
    if kept:
        print(f"cpu: every test's CPU-seconds ({KEEP_REPORTS_VAR}): {', '.join(str(path) for path in kept)}")
    print(f"make test: tests/unit {verdict(unit)}, tests/bats {verdict(bats_code)}, tests/e2e {verdict(e2e)}",
          flush=True)
    return 0 if unit == bats_code == e2e == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
