"""NCCL's own view of a hang: one query of its RAS service, read into a verdict the hang report carries.

Since NCCL 2.24 every NCCL process runs a RAS thread; the threads watch each other and answer
clients on a local socket (localhost:28028 unless NCCL_RAS_ADDR says otherwise; NCCL_RAS_ENABLE=0
turns it off). The protocol is lines of text: "CLIENT PROTOCOL 2" (answered "SERVER PROTOCOL 2"),
"TIMEOUT <s>" and, since 2.28.7, "SET FORMAT json" (each answered "OK"; an older NCCL answers
"ERROR: Unknown command ..."), then "STATUS", answered with the report, after which NCCL closes
the connection. The JSON lists every communicator's ranks with their collective counts and status
and its missing ranks ("unresponsive", "considered_dead"); the text report says the same for
people: INCOMPLETE and DEAD processes, MISMATCH of collective counts, with the outliers' ranks.
Sources: NCCL's RAS documentation (docs/userguide/source/troubleshooting/ras.rst,
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/ras.html), its client
(src/ras/client.cc, `ncclras`) and server (src/ras/client_support.cc) in NVIDIA/nccl, and
NCCL_RAS_ADDR / NCCL_RAS_ENABLE in its environment documentation (env.rst). Ray Train
(ray-project/ray PR #64928) and SGLang (sgl-project/sglang PR #32929) read the same answers.

Read as evidence beside the watchdog's, never instead of it: a RAS that reports every rank OK while
PyTorch timed out has been seen (NVIDIA/nccl#1730), and its counts race the collectives, so a
mismatch means a hang only once the counts stop moving (ras.rst) — the watchdog asks only after
ranks have stopped advancing for half the collective timeout. One query per hang, never a poll:
polling RAS has crashed NCCL processes (NVIDIA/nccl#1669, #1718).

A plain socket and the standard library (a client this small is shorter than wrapping the
`ncclras` binary, which the image may not carry: Ray's callback degrades to nothing without it).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

ADDR_VAR = "NCCL_RAS_ADDR"
ENABLE_VAR = "NCCL_RAS_ENABLE"
DEFAULT_HOST, DEFAULT_PORT = "localhost", 28028   # ras_internal.h: NCCL_RAS_CLIENT_PORT
PROTOCOL = 2                                      # ras_internal.h: NCCL_RAS_CLIENT_PROTOCOL
# NCCL waits this long for each leg of its own gathering (the `ncclras -t` default is 5 s): a stopped
# process's data then comes back missing instead of holding the answer up.
LEG_TIMEOUT_S = 4
MAX_ANSWER_BYTES = 16 << 20
JSON_SINCE = (2, 28, 7)   # ras.rst, "JSON Output": "Starting with NCCL 2.28.7"


class Unanswered(Exception):
    """No report: nothing listens, or what answers does not speak the protocol."""


@dataclass(frozen=True)
class Answer:
    address: str
    format: str     # "json" | "text"
    text: str


def address(env: Mapping[str, str]) -> tuple[str, int]:
    """(host, port) of the RAS client socket: NCCL_RAS_ADDR as NCCL reads it (`host:port`, `[ipv6]:port`;
    NCCL's ncclSocketGetAddrFromString), else NCCL's default localhost:28028."""
    value = env.get(ADDR_VAR, "").strip()
    if not value:
        return DEFAULT_HOST, DEFAULT_PORT
    match = re.fullmatch(r"\[([^\]]+)\]:(\d+)|([^:\[\]]+):(\d+)", value)
    if not match:
        raise ValueError(f"{ADDR_VAR}={value!r} is not host:port or [ipv6]:port")
    host = match.group(1) or match.group(3)
    return host, int(match.group(2) or match.group(4))


def show_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def query(host: str, port: int, budget_s: float, leg_timeout_s: int = LEG_TIMEOUT_S) -> Answer:
    """One STATUS report, in JSON where the NCCL answering has it, else text; Unanswered says why not.
    Every address of host is tried, as `ncclras` does (NCCL binds "localhost" to its first address,
    which may be ::1)."""
    deadline = time.monotonic() + budget_s
    where = show_address(host, port)
    try:
        conn = socket.create_connection((host, port), timeout=max(0.1, min(2.0, budget_s)))
    except ConnectionRefusedError:
        raise Unanswered(f"nothing listens on {where}") from None
    except OSError as error:
        raise Unanswered(f"cannot connect to {where} ({error.strerror or error})") from None
    with conn:
        lines = _LineReader(conn, deadline)

        def ask(command: str) -> str:
            conn.settimeout(max(0.05, deadline - time.monotonic()))
            conn.sendall(command.encode() + b"\n")
            return lines.line()

        try:
            greeting = ask(f"CLIENT PROTOCOL {PROTOCOL}")
            if not greeting.upper().startswith("SERVER PROTOCOL "):
                raise Unanswered(f"{where} answered {greeting[:60]!r}, not NCCL RAS's 'SERVER PROTOCOL'")
            said = ask(f"TIMEOUT {leg_timeout_s}")
            if said.upper() != "OK":
                raise Unanswered(f"{where} refused TIMEOUT {leg_timeout_s}: {said[:80]}")
            form = "json" if ask("SET FORMAT json").upper() == "OK" else "text"
            conn.settimeout(max(0.05, deadline - time.monotonic()))
            conn.sendall(b"STATUS\n")
            text = lines.rest()
        except (socket.timeout, TimeoutError):
            raise Unanswered(f"{where} did not finish its report within {budget_s:.0f} s") from None
        except OSError as error:
            raise Unanswered(f"{where} broke off ({error.strerror or error})") from None
    if not text.strip():
        raise Unanswered(f"{where} closed the connection without a report")
    return Answer(where, form, text)


class _LineReader:
    def __init__(self, conn: socket.socket, deadline: float):
        self._conn, self._deadline, self._buffer = conn, deadline, b""

    def _more(self) -> bytes:
        self._conn.settimeout(max(0.05, self._deadline - time.monotonic()))
        if time.monotonic() >= self._deadline:
            raise TimeoutError
        return self._conn.recv(65536)

    def line(self) -> str:
        while b"\n" not in self._buffer:
            chunk = self._more()
            if not chunk:
                raise Unanswered("the connection closed in the middle of the handshake")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").strip()

    def rest(self) -> str:
        """Everything until NCCL closes the connection (it does once the report is sent)."""
        while len(self._buffer) < MAX_ANSWER_BYTES:
            chunk = self._more()
            if not chunk:
                break
            self._buffer += chunk
        return self._buffer.decode(errors="replace")


# -- reading a report ---------------------------------------------------------------------------

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


def read(answer: Answer) -> Verdict:
    """The report as a verdict; ValueError when it cannot be read (it is kept as written all the same)."""
    if answer.format == "json":
        try:
            return read_json(answer.text)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"its JSON does not read as NCCL's ({error})") from None
    if "Job summary" not in answer.text and "Communicators" not in answer.text:
        raise ValueError("its text is not NCCL's status report")
    return read_text(answer.text)


# -- what the hang report says ------------------------------------------------------------------

def span(numbers: Iterable[int]) -> str:
    """1,2,3,5 -> "1-3,5"."""
    values = sorted(set(numbers))
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _where(rank: Rank, names: Mapping[str, str]) -> str:
    host = names.get(rank.host, rank.host) if rank.host else "an unknown node"
    return f"process {rank.pid} on {host}" if rank.pid else host


def verdict_line(verdict: Verdict, stalled: Sequence[int], names: Mapping[str, str] = {}) -> str:
    """One line: what NCCL says is wrong (missing ranks, counts apart, the nodes), or that it says OK."""
    about = f"NCCL {verdict.nccl_version}, {verdict.communicators} communicator(s)"
    if verdict.format == "text":
        about += "; a text report: JSON needs NCCL 2.28.7"
    if verdict.healthy:
        who = f"rank(s) {span(stalled)} stopped advancing" if stalled else "ranks stopped advancing"
        return (f"NCCL RAS ({about}) reports every rank present and every collective count equal while "
                f"{who}: RAS has said OK during hangs before (NVIDIA/nccl#1730), so the watchdog's verdict stands")
    said = []
    for kind, group in (("dead", [m for m in verdict.missing if m.dead]),
                        ("missing", [m for m in verdict.missing if not m.dead])):
        if group:
            places = "; ".join(dict.fromkeys(_where(m, names) for m in group if m.host or m.pid))
            said.append(f"rank(s) {span(m.rank for m in group)} {kind}" + (f" ({places})" if places else ""))
    named = {m.pid for m in verdict.missing if m.pid}
    for process in verdict.processes:
        if process.pid not in named:
            said.append(f"{_where(process, names)} " + ("considered dead" if process.dead else "sent no data"))
    for gap in verdict.gaps:
        apart = f"{gap.operation} counts apart in communicator {gap.communicator}: "
        if gap.behind:
            places = "; ".join(dict.fromkeys(_where(r, names) for r in gap.behind if r.host))
            said.append(apart + f"rank(s) {span(r.rank for r in gap.behind)} at {gap.behind_count}, others up to "
                        f"{gap.ahead_count}" + (f" ({places})" if places else ""))
        elif gap.ahead:
            said.append(apart + f"rank(s) {span(r.rank for r in gap.ahead)} ahead at {gap.ahead_count}, the "
                        f"others (not named by NCCL) at {gap.behind_count}")
        else:
            said.append(apart + f"some at {gap.behind_count}, others up to {gap.ahead_count}")
    said += verdict.errors[:3]
    hosts = verdict.hosts()
    nodes = f"; node(s): {', '.join(names.get(h, h) for h in hosts)}" if hosts else ""
    return f"NCCL RAS ({about}): " + "; ".join(said) + nodes


def names_of(hosts: Iterable[str], budget_s: float = 1.0) -> dict[str, str]:
    """{address: host name} for the addresses /etc/hosts or DNS name, asked within budget_s (RAS
    names nodes by the address of NCCL's bootstrap interface)."""
    names, deadline = {}, time.monotonic() + budget_s
    for host in hosts:
        if time.monotonic() >= deadline:
            break
        try:
            name = socket.gethostbyaddr(host)[0]
        except (OSError, UnicodeError):
            continue
        if name and name != host:
            names[host] = name.split(".")[0]
    return names


@dataclass(frozen=True)
class Consulted:
    line: str                       # for the job's output, with "ddp-launch: " before it
    saved: str | None = None        # the report as NCCL wrote it, in the forensics directory


def consult(env: Mapping[str, str], forensics: str, node: str, own_pids: Iterable[int], stalled: Sequence[int],
            budget_s: float, ask: Callable[[str, int, float], Answer] = query,
            name: Callable[[Iterable[str]], dict] = names_of) -> Consulted:
    """Ask this node's RAS once; keep its report beside the stacks; say its verdict, or in one line why
    there is none (RAS off, an NCCL before 2.24 or none at all, another job's RAS)."""
    if env.get(ENABLE_VAR, "").strip() == "0":
        return Consulted(f"NCCL RAS is off ({ENABLE_VAR}=0): no verdict from NCCL")
    try:
        host, port = address(env)
    except ValueError as error:
        return Consulted(f"NCCL RAS not asked: {error}")
    try:
        answer = ask(host, port, budget_s)
    except Unanswered as why:
        return Consulted(f"NCCL RAS: {why} (NCCL older than 2.24, {ENABLE_VAR}=0, another {ADDR_VAR}, "
                         f"or no NCCL in these workers): no verdict from NCCL")
    saved = os.path.join(forensics, f"nccl-ras-{node}.{'json' if answer.format == 'json' else 'txt'}")
    try:
        os.makedirs(forensics, exist_ok=True)
        with open(saved + ".tmp", "w") as out:
            out.write(answer.text)
        os.replace(saved + ".tmp", saved)
    except OSError:
        saved = None
    where = f"; its report: {saved}" if saved else ""
    try:
        verdict = read(answer)
    except ValueError as error:
        return Consulted(f"NCCL RAS at {answer.address} answered, but {error}{where}", saved)
    own = set(own_pids)
    # Only the JSON names every rank's process; the text names outliers only, often on other nodes.
    if verdict.format == "json" and own and verdict.pids and not own & verdict.pids:
        return Consulted(f"NCCL RAS at {answer.address} answered for another job (none of the processes it "
                         f"names is a worker of {node}): ignored; where jobs share a node, give each its own "
                         f"{ADDR_VAR} (NCCL's environment documentation){where}", saved)
    return Consulted(verdict_line(verdict, stalled, name(verdict.hosts())) + where, saved)
