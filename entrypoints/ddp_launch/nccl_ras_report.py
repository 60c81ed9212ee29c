"""NCCL's RAS status report, as NCCL 2.24 to 2.30 write it, read into a verdict: the ranks missing or dead,
the collectives whose counts differ between ranks, the ranks in error, with their processes and nodes.

The JSON (2.28.7 and later, `SET FORMAT json`) lists every rank of every communicator; the text names
ranks and processes only where NCCL counts them as outliers (NVIDIA/nccl src/ras/client_support.cc:
rasCountIsOutlier; docs/userguide/source/troubleshooting/ras.rst). Pure: text in, a Verdict out
(ddp_launch.nccl_ras asks and says).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rank:
    rank: int
    host: str
    pid: int | None = None


@dataclass(frozen=True)
class Missing(Rank):
    dead: bool = False      # considered dead (unreachable for 60 s), else unresponsive


@dataclass(frozen=True)
class CountGap:
    """One collective whose launched counts differ between a communicator's ranks: behind are the
    ranks at the lowest count, ahead those at the highest, as far as the report names them (the text
    names a group's ranks only when it is an outlier: NVIDIA/nccl#1911)."""

    communicator: str
    operation: str
    behind: tuple[Rank, ...]
    behind_count: int
    ahead_count: int
    ahead: tuple[Rank, ...] = ()


@dataclass(frozen=True)
class Verdict:
    nccl_version: str
    format: str
    communicators: int
    missing: tuple[Missing, ...] = ()
    processes: tuple[Missing, ...] = ()     # processes the text report names as sending no data, or dead
    gaps: tuple[CountGap, ...] = ()
    errors: tuple[str, ...] = ()            # ranks in error, aborted, or in a status apart
    pids: frozenset = frozenset()           # every process the report names

    @property
    def healthy(self) -> bool:
        return not (self.missing or self.processes or self.gaps or self.errors)

    def hosts(self) -> tuple[str, ...]:
        found = [r.host for r in (*self.missing, *self.processes) if r.host]
        found += [r.host for gap in self.gaps for r in gap.behind if r.host]
        return tuple(dict.fromkeys(found))


# NCCL 2.28.7 to 2.28.9 print a missing rank's "nvml_dev" without the comma before its "status"
# (jsonWriteMissingRank in src/ras/client_support.cc; fixed in 2.29): malformed JSON exactly when a
# rank is missing. The comma goes back where a value ends a line and a key starts the next.
_MISSING_COMMA = re.compile(r'([0-9el"\]}])(\s*\n\s*)("[A-Za-z_]+"\s*:)')


def read_json(text: str) -> Verdict:
    try:
        data = json.loads(text)
    except ValueError:
        data = json.loads(_MISSING_COMMA.sub(r"\1,\2\3", text))
    communicators = data.get("communicators") or []
    missing, gaps, errors, pids = [], [], [], set()
    for comm in communicators:
        name = str(comm.get("hash", "?"))
        ranks = [r for r in comm.get("ranks") or [] if isinstance(r, dict)]
        for entry in comm.get("missing_ranks") or []:
            status = entry.get("status") or {}
            missing.append(Missing(int(entry["rank"]), str(entry.get("host", "")), _pid(entry.get("pid")),
                                   bool(status.get("considered_dead"))))
        pids.update(p for p in (_pid(r.get("pid")) for r in (*ranks, *(comm.get("missing_ranks") or [])))
                    if p is not None)
        for rank in ranks:
            status = rank.get("status") or {}
            trouble = [what for what, bad in (
                (f"async error {status.get('async_error')}", status.get("async_error") not in (0, None)),
                (f"init state {status.get('init_state')}", status.get("init_state") not in (0, 7, None)),
                ("aborted", bool(status.get("abort_flag")))) if bad]
            if trouble:
                errors.append(f"rank {rank.get('rank')} on {rank.get('host', '?')}: {', '.join(trouble)}")
        operations = dict.fromkeys(op for r in ranks for op in (r.get("collective_counts") or {}))
        for op in operations:
            counts = {int(r["rank"]): int((r.get("collective_counts") or {}).get(op, 0)) for r in ranks}
            if len(set(counts.values())) < 2:
                continue
            low, high = min(counts.values()), max(counts.values())
            behind = tuple(Rank(int(r["rank"]), str(r.get("host", "")), _pid(r.get("pid")))
                           for r in ranks if counts[int(r["rank"])] == low)
            ahead = tuple(Rank(int(r["rank"]), str(r.get("host", "")), _pid(r.get("pid")))
                          for r in ranks if counts[int(r["rank"])] == high)
            gaps.append(CountGap(name, op, behind, low, high, ahead))
    return Verdict(str(data.get("nccl_version", "?")), "json", len(communicators), tuple(missing), (),
                   tuple(gaps), tuple(errors), frozenset(pids))


def _pid(value: object) -> int | None:
    try:
        pid = int(value)
    except (TypeError, ValueError):
        return None
    return pid if pid > 0 else None


_VERSION = re.compile(r"^NCCL version (\S+)", re.M)
_COMM_HEADER = re.compile(r"^#\d+-\d+ \((\w+)\) (INCOMPLETE|MISMATCH|ERROR)\s*$")
_RANK_LINE = re.compile(r"^\s+Rank (\d+)(?: has launched up to operation (\d+)| has not launched any operations)?"
                        r"(?: has status \w+| reported [^-]+)?"
                        r" -- (?:GPU \S+(?: \(NVML \d+\))? managed by process (\d+) on node (\S+)"
                        r"|\[process information not found\])")
_PROCESS_LINE = re.compile(r"^\s+Process (\d+) on node (\S+) managing GPU")
_MISSING_LIST = re.compile(r"^\s+The missing ranks?: ([\d, -]+)$")
_COUNTS_DIFFER = re.compile(r"^\s+Communicator ranks have different (?:(\w+) )?operation counts$")
_GROUP_COUNT = re.compile(r"^\s+(\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)$")
_SUMMARY_ROW = re.compile(r"^\s*\d+\s+\d+\s+\d+\s+\S+\s+\d+\s+\d+\s+(\w+)\s+(\S+)\s*$")


class _TextReport:
    """NCCL's human report (the text output of client_support.cc, 2.24 to 2.30), read line by line:
    the summary table's Errors column, then the Errors and Warnings sections block by block. Ranks
    and processes are listed only where NCCL names them (its outliers)."""

    def __init__(self) -> None:
        self.section, self.block, self.comm = "", "", "?"
        self.missing: list[Missing] = []
        self.processes: list[Missing] = []
        self.gaps: list[CountGap] = []
        self.errors: list[str] = []
        self.pids: set[int] = set()
        self.gap: dict | None = None

    def close_gap(self) -> None:
        gap, self.gap = self.gap, None
        if gap and gap["counts"]:
            low, high = min(gap["counts"]), max(gap["counts"])
            behind = tuple(rank for rank, count in gap["listed"] if count == low)
            ahead = tuple(rank for rank, count in gap["listed"] if count == high)
            self.gaps.append(CountGap(self.comm, gap["op"], behind, low, high, ahead))

    def take(self, line: str) -> None:
        if line in ("Errors", "Warnings"):
            self.close_gap()
            self.section, self.block = line, ""
            return
        if not self.section or not line.strip() or set(line) == {"="}:
            return
        header = _COMM_HEADER.match(line)
        if header:
            self.close_gap()
            self.comm, self.block = header.group(1), header.group(2)
            return
        if not line.startswith(" "):  # INCOMPLETE, DEAD, TIMEOUT: about processes, not a communicator
            self.close_gap()
            self.block, self.comm = line.strip() + " processes", "?"
            return
        process = _PROCESS_LINE.match(line)
        if process:
            pid, host = int(process.group(1)), process.group(2)
            self.pids.add(pid)
            if self.block in ("INCOMPLETE processes", "DEAD processes"):
                self.processes.append(Missing(-1, host, pid, self.block == "DEAD processes"))
            return
        counts = _COUNTS_DIFFER.match(line)
        if counts and self.block == "MISMATCH":
            self.close_gap()
            self.gap = {"op": counts.group(1) or "collective", "counts": [], "listed": [], "last": 0}
            return
        group = _GROUP_COUNT.match(line)
        if group and self.gap is not None:
            self.gap["last"] = int(group.group(2) or 0)
            self.gap["counts"].append(self.gap["last"])
            return
        listed = _MISSING_LIST.match(line)
        if listed and self.block == "INCOMPLETE":
            self.missing += [Missing(rank, "") for rank in _ranks(listed.group(1))]
            return
        rank_line = _RANK_LINE.match(line)
        if rank_line:
            self._rank(line, rank_line)
        elif self.block == "ERROR":
            self.errors.append(f"communicator {self.comm}: {line.strip()}")

    def _rank(self, line: str, found: "re.Match[str]") -> None:
        pid = int(found.group(3)) if found.group(3) else None
        rank = Rank(int(found.group(1)), found.group(4) or "", pid)
        if pid:
            self.pids.add(pid)
        if self.block == "INCOMPLETE":
            self.missing.append(Missing(rank.rank, rank.host, pid))
        elif self.gap is not None:
            alone = found.group(2) is not None or "has not launched" in line  # a group of one names its count
            count = int(found.group(2) or 0) if alone else self.gap["last"]
            if alone:
                self.gap["counts"].append(count)
            self.gap["listed"].append((rank, count))
        elif self.block == "ERROR":
            self.errors.append(f"communicator {self.comm}: {line.strip()}")


def read_text(text: str) -> Verdict:
    report = _TextReport()
    for line in text.splitlines():
        report.take(line.rstrip())
    report.close_gap()
    rows = [match.group(2) for match in map(_SUMMARY_ROW.match, text.splitlines()) if match]
    dead = {p.pid for p in report.processes if p.dead}
    missing = tuple(Missing(m.rank, m.host, m.pid, m.pid in dead) if m.pid in dead else m for m in report.missing)
    errors = list(report.errors)
    if any(row != "OK" for row in rows) and not (missing or report.processes or report.gaps or errors):
        errors.append(f"the summary says {', '.join(sorted(set(rows) - {'OK'}))} without naming ranks")
    version = _VERSION.search(text)
    return Verdict(version.group(1) if version else "?", "text", len(rows), missing, tuple(report.processes),
                   tuple(report.gaps), tuple(errors), frozenset(report.pids))


def _ranks(listed: str) -> list[int]:
    found = []
    for part in listed.replace(" ", "").split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            found += list(range(int(low), int(high) + 1)) if high.isdigit() else [int(low)]
    return found


def read(form: str, text: str) -> Verdict:
    """A report ("json" or "text") as a verdict; ValueError when it cannot be read."""
    if form == "json":
        try:
            return read_json(text)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"its JSON does not read as NCCL's ({error})") from None
    if "Job summary" not in text and "Communicators" not in text:
        raise ValueError("its text is not NCCL's status report")
    return read_text(text)
