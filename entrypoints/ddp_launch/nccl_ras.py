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
Here the asking and the line the hang report gets; the report's reading is nccl_ras_report.py.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ddp_launch.nccl_ras_report import Rank, Verdict, read

ADDR_VAR = "NCCL_RAS_ADDR"
ENABLE_VAR = "NCCL_RAS_ENABLE"
DEFAULT_HOST, DEFAULT_PORT = "localhost", 28028   # ras_internal.h: NCCL_RAS_CLIENT_PORT
PROTOCOL = 2                                      # ras_internal.h: NCCL_RAS_CLIENT_PROTOCOL
# NCCL waits this long for each leg of its own gathering (the `ncclras -t` default is 5 s): a stopped
# process's data then comes back missing instead of holding the answer up.
LEG_TIMEOUT_S = 4
MAX_ANSWER_BYTES = 16 << 20


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
        verdict = read(answer.format, answer.text)
    except ValueError as error:
        return Consulted(f"NCCL RAS at {answer.address} answered, but {error}{where}", saved)
    own = set(own_pids)
    # Only the JSON names every rank's process; the text names outliers only, often on other nodes.
    if verdict.format == "json" and own and verdict.pids and not own & verdict.pids:
        return Consulted(f"NCCL RAS at {answer.address} answered for another job (none of the processes it "
                         f"names is a worker of {node}): ignored; where jobs share a node, give each its own "
                         f"{ADDR_VAR} (NCCL's environment documentation){where}", saved)
    return Consulted(verdict_line(verdict, stalled, name(verdict.hosts())) + where, saved)
