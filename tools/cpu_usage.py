"""The CPU-seconds a process and everything it starts spend, SLURM's daemons and jobs included.

A test of the e2e suite starts a cluster whose daemons detach (slurmctld, slurmd), and its jobs run
under slurmstepd, not as the test's children: getrusage(2)'s RUSAGE_CHILDREN counts only children that
were waited for, and /proc/stat counts the whole machine, the other workers' clusters and any other
user's work with it. A cgroup counts exactly the processes in it: a process is born into its parent's
cgroup and stays there through setsid, daemonizing and namespaces, so every process a pytest worker
starts, and every process those start, is in the worker's cgroup, and cgroup v2's `cpu.stat` reports
their CPU time, the descendant groups' included ("usage_usec": this file exists whether the controller
is enabled or not, https://docs.kernel.org/admin-guide/cgroup-v2.html, "Core Interface Files" and "CPU").
No controller is turned on, so the group limits nothing; it is made under the process's own v2 group
(where a hybrid host mounts v2 beside v1's controllers, /sys/fs/cgroup/unified, nothing else changes).

Where no cgroup v2 can be made (not root, a read-only /sys/fs/cgroup), the meter falls back to
getrusage(2): the process and the children it waited for, which misses the daemons and their jobs, and
says so.
"""

from __future__ import annotations

import json
import os
import resource
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional

# Every group this module makes is named PREFIX-<label>-<pid>, so a run killed before it could remove its
# own is removed by the next one (only once that pid is gone).
PREFIX = "ddp-cpu"


def cgroup2_mount(mountinfo: str) -> Optional[Path]:
    """Where the cgroup v2 hierarchy is mounted, from /proc/self/mountinfo (proc(5): the mount point is
    the fifth field, the filesystem type the first after the " - " separator); None where it is not."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        if sep and after.split()[:1] == ["cgroup2"]:
            return Path(before.split()[4])
    return None


def own_cgroup2(proc_cgroup: str) -> Optional[str]:
    """This process's v2 group, from /proc/self/cgroup's "0::PATH" line (cgroups(7)); None without one."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def usage_s(cpu_stat: str) -> float:
    """cpu.stat's usage_usec (user and system time of the group and its descendants), in seconds."""
    for line in cpu_stat.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    raise ValueError(f"cpu.stat has no usage_usec line: {cpu_stat[:80]!r}")


class RusageMeter:
    """getrusage(2): this process and the children it waited for. No daemon, no SLURM job."""

    counts_detached = False
    source = "getrusage(2), without detached processes such as SLURM's jobs: no cgroup v2 could be made"

    def read(self) -> float:
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def close(self) -> None:
        pass


class CgroupMeter:
    """A cgroup v2 group of this process's own, made under its group and joined: read() is the CPU time of
    every process started from here on, detached daemons and their children included."""

    counts_detached = True
    source = "a cgroup v2 of its own, detached processes such as SLURM's jobs included"

    def __init__(self, directory: Path, home: Path):
        self.directory, self.home = directory, home

    @staticmethod
    def join(label: str) -> "CgroupMeter":
        """Raises OSError where no v2 group can be made or joined."""
        mount = cgroup2_mount(Path("/proc/self/mountinfo").read_text())
        own = own_cgroup2(Path("/proc/self/cgroup").read_text())
        if mount is None or own is None:
            raise OSError("no cgroup v2 hierarchy")
        home = mount / own.lstrip("/")
        _remove_stale(home)
        directory = home / f"{PREFIX}-{label}-{os.getpid()}"
        directory.mkdir(exist_ok=True)
        try:
            (directory / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError:
            directory.rmdir()
            raise
        return CgroupMeter(directory, home)

    def read(self) -> float:
        return usage_s((self.directory / "cpu.stat").read_text())

    def close(self) -> None:
        """Back to the home group, with anything still running here (a daemon that outlived its test), and
        the group removed. Best effort: a group that will not go is removed by a later run."""
        try:
            (self.home / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError:
            return
        _remove_group(self.directory, self.home)


def _remove_group(directory: Path, home: Path) -> None:
    """directory and the groups below it (a nested run's that was killed), their processes moved to home."""
    for group in sorted((d for d in directory.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)) + [directory]:
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (home / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass  # gone meanwhile
            group.rmdir()
        except OSError:
            pass


def _remove_stale(home: Path) -> None:
    """The groups of earlier runs whose process is gone (killed before it could remove its own)."""
    for directory in home.glob(f"{PREFIX}-*"):
        pid = directory.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _remove_group(directory, home)


def meter(label: str):
    """A CgroupMeter where one can be made, else a RusageMeter."""
    try:
        return CgroupMeter.join(label)
    except (OSError, ValueError):
        return RusageMeter()


# -- what a test run costs, test by test ----------------------------------------------------------------

@dataclass(frozen=True)
class Cost:
    """CPU-seconds and wall seconds of one test (its set-up, call and teardown, less the shared fixtures
    they set up or tore down) or of one shared fixture (module, package or session scope)."""
    kind: str          # "test" or "fixture"
    name: str          # the test's node id, or "NAME (WHERE)" for a fixture
    cpu_s: float
    wall_s: float


@dataclass(frozen=True)
class Ledger:
    """A suite's costs: every test and shared fixture, and the CPU-seconds its processes spent in all."""
    suite: str
    costs: tuple
    total_cpu_s: float     # every process of the run (per source); 0.0 where unknown
    source: str

    @property
    def tests_cpu_s(self) -> float:
        return sum(c.cpu_s for c in self.costs if c.kind == "test")

    @property
    def fixtures_cpu_s(self) -> float:
        return sum(c.cpu_s for c in self.costs if c.kind == "fixture")


def merged(costs: Iterable[Cost]) -> list[Cost]:
    """One Cost per kind and name: a fixture set up by several workers, a test's three phases."""
    sums: dict = {}
    for cost in costs:
        cpu, wall = sums.get((cost.kind, cost.name), (0.0, 0.0))
        sums[(cost.kind, cost.name)] = (cpu + cost.cpu_s, wall + cost.wall_s)
    return [Cost(kind, name, cpu, wall) for (kind, name), (cpu, wall) in sums.items()]


def heaviest(costs: Iterable[Cost], count: int) -> list[Cost]:
    return sorted(merged(costs), key=lambda c: (-c.cpu_s, c.name))[:count]


def ledger_lines(ledger: Ledger, count: int, import_s: Optional[float] = None) -> list[str]:
    """The suite's CPU-seconds in all and its `count` heaviest tests and shared fixtures, one a line."""
    units = (lambda s: f" ({s / import_s:,.0f} torch imports)") if import_s else (lambda s: "")
    lines = []
    if ledger.total_cpu_s:
        between = ledger.total_cpu_s - ledger.tests_cpu_s - ledger.fixtures_cpu_s
        lines.append(f"cpu: {ledger.suite}: {ledger.total_cpu_s:,.0f} CPU-s{units(ledger.total_cpu_s)}: tests "
                     f"{ledger.tests_cpu_s:,.0f}, shared fixtures {ledger.fixtures_cpu_s:,.0f}, the rest (start-up, "
                     f"collection) {between:,.0f}; counted by {ledger.source}")
    top = heaviest(ledger.costs, count)
    if top:
        lines.append(f"cpu: {ledger.suite}: the {len(top)} heaviest, in CPU-s (and wall s):")
        lines += [f"cpu: {c.cpu_s:8,.1f} ({c.wall_s:6,.0f} s)  {'' if c.kind == 'test' else 'fixture '}{c.name}"
                  for c in top]
    return lines


def write_ledger(path: Path, ledger: Ledger) -> None:
    path.write_text(json.dumps({**asdict(ledger), "costs": [asdict(c) for c in ledger.costs]}))


def read_ledger(path: Path) -> Optional[Ledger]:
    """The ledger a pytest run wrote, or None where it wrote none (it stopped first) or a damaged one."""
    try:
        data = json.loads(path.read_text())
        return Ledger(data["suite"], tuple(Cost(**c) for c in data["costs"]), float(data["total_cpu_s"]),
                      data["source"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fixture_name(argname: str, where: str) -> str:
    return f"{argname} ({where or 'session'})"
