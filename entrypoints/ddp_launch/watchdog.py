"""The agent's hang watchdog: which local rank stopped advancing, its stacks, one line, and the end.

A collective timeout names nobody (nccl#1324, nccl#1260, pytorch#118369), and most watchdog
timeouts have a CPU-side cause that a longer timeout does not fix (PyTorch's Flight Recorder
post, https://pytorch.org/blog/flight-recorder-a-new-lightweight-tool-for-debugging-distributed-training/).
Each node's agent reads its own workers' heartbeats (ddp_contract.heartbeat). When a rank has
not advanced for its stall threshold (half the collective timeout) in a training phase, the
agent decides about its own ranks only, which it can see: a rank stuck outside the all-reduce,
behind a local peer, or stopped by the kernel (state T/D) is the culprit; ranks that launched
every gradient bucket and wait are victims. It then has every local worker write its Python
stacks (faulthandler) and Flight Recorder buffer into <run_dir>/forensics, prints one line per
culprit, and kills the culprit: its peers' collectives then fail at once, on every node, and the
job ends with a crash (exit 1), well within the collective timeout. A node whose ranks only
wait says so in one line, and leaves the ending to the culprit's node or to the timeout.
Meanwhile it asks NCCL's own RAS service once (nccl_ras.py), before the culprit is killed: its
report goes beside the stacks, and one line says NCCL's verdict (missing ranks, collective counts
apart, their nodes), that it says OK, or why there is none.
"""

from __future__ import annotations

import mmap
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ddp_contract import heartbeat as hb
from ddp_launch import nccl_ras

POLL_S = 1.0
DUMP_WAIT_S = 5.0       # for faulthandler and the Flight Recorder dump to land
STACKS_SIGNAL = signal.SIGURG   # what ddp_train.safety.heartbeat registers faulthandler on
# The most the culprit's end waits for NCCL's RAS (asked while the stacks are written): NCCL's own
# client waits its leg timeout and 5 s more (src/ras/client.cc). Never more than half of what is
# left of the collective timeout (Watchdog.ras_budget_s).
RAS_BUDGET_S = 10.0
# /proc/PID/stat states that say the process is not running on its own (proc(5)).
STOPPED_STATES = {"T": "stopped by a signal", "t": "stopped by a tracer", "D": "in uninterruptible sleep"}


@dataclass(frozen=True)
class Beat:
    """One local rank as its heartbeat and /proc show it."""

    rank: int
    pid: int
    node: str
    phase: int
    step: int
    buckets: int
    idle_s: float           # seconds since it last advanced
    stall_after_s: float
    state: str              # /proc/PID/stat state letter, "" when gone
    run_dir: str
    main_thread: int

    @property
    def progress(self) -> tuple[int, int, int]:
        """How far this rank got: step, then phase within the step, then buckets launched."""
        order = hb.WATCHED_PHASES.index(self.phase) if self.phase in hb.WATCHED_PHASES else -1
        return self.step, order, self.buckets

    @property
    def stalled(self) -> bool:
        return self.phase in hb.WATCHED_PHASES and self.idle_s >= self.stall_after_s and self.state != ""


def culprits(beats: Sequence[Beat]) -> list[Beat]:
    """The stalled local ranks that the others wait for (pure).

    First those the kernel holds (stopped, or in uninterruptible sleep: proc(5)); else, when
    local ranks got unequally far, the ones furthest behind. Ranks that stalled at the same
    point wait for a rank elsewhere: none of them is named. (Phase alone cannot tell: DDP's
    forward broadcasts buffers, so a waiting rank may sit in the forward too.)
    """
    stalled = [b for b in beats if b.stalled]
    held = [b for b in stalled if b.state in STOPPED_STATES]
    if held or not stalled:
        return held
    alive = [b for b in beats if b.state]
    if len({b.progress for b in alive}) < 2:
        return []
    behind = min(b.progress for b in alive)
    return [b for b in stalled if b.progress == behind]


_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def where_stopped(stacks: str, main_thread: int) -> str:
    """The main thread's innermost frame from faulthandler's text, and the trainer's own frame
    below it when that differs: "conv.py:456 in _conv_forward (from ddp_train/train.py:104 in
    train_step)". faulthandler writes the most recent call first (docs.python.org, faulthandler)."""
    frames: dict[int, list[tuple[str, str, str]]] = {}
    current = None
    for line in stacks.splitlines():
        thread = _THREAD.match(line)
        if thread:
            current = int(thread.group(1), 16)
            frames[current] = []
            continue
        frame = _FRAME.match(line)
        if frame and current is not None:
            frames[current].append((frame["file"], frame["line"], frame["func"]))
    main = frames.get(main_thread) or (next(iter(frames.values())) if frames else [])
    if not main:
        return "an unknown place (no Python stack was written)"

    def show(frame: tuple[str, str, str]) -> str:
        file, line, func = frame
        for marker in ("/site-packages/", "/dist-packages/", "/src/"):
            if marker in file:
                file = file.split(marker, 1)[1]
                break
        return f"{file}:{line} in {func}"

    top = show(main[0])
    own = next((f for f in main if "/ddp_train/" in f[0]), None)
    return top if own is None or own == main[0] else f"{top} (from {show(own)})"


def hang_line(beat: Beat, where: str, forensics: str) -> str:
    state = STOPPED_STATES.get(beat.state)
    how = f"; its process was {state} ({beat.state})" if state else ""
    return (f"ddp-launch: error: rank {beat.rank} on {beat.node} stopped advancing at step {beat.step} "
            f"({hb.PHASE_NAMES[beat.phase]}, {beat.idle_s:.0f} s without progress{how}) at {where}; "
            f"the other ranks wait for it in a collective; stacks and Flight Recorder dumps "
            f"in {forensics}")


def waiting_line(node: str, waiting: Sequence[Beat], forensics: str) -> str:
    ranks = ",".join(str(b.rank) for b in waiting)
    step = max(b.step for b in waiting)
    return (f"ddp-launch: ranks {ranks} on {node} have waited {min(b.idle_s for b in waiting):.0f} s in "
            f"the gradient all-reduce at step {step} for a rank on another node; stacks in {forensics}")


def ras_budget_s(stalled: Sequence[Beat]) -> float:
    """How long NCCL's RAS may take: RAS_BUDGET_S, but at most half of what the collective timeout
    leaves after the stall threshold (the threshold is half the timeout), so the culprit still ends
    the job before its peers time out."""
    return max(1.0, min(RAS_BUDGET_S, min(b.stall_after_s for b in stalled) / 2))


def process_state(pid: int, proc: str = "/proc") -> str:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2:].split()[0]


class Watchdog:
    """Reads the heartbeat directory once a second on a daemon thread; acts once per set of workers."""

    def __init__(self, directory: str, say: Callable[[str], None] = lambda line: print(line, file=sys.stderr,
                                                                                        flush=True),
                 env: Mapping[str, str] = os.environ):
        self.directory = directory
        self.say = say
        self.env = env  # the workers' environment: NCCL_RAS_ADDR, NCCL_RAS_ENABLE
        self._records: dict[int, tuple[int, mmap.mmap]] = {}   # rank -> (pid, its record)
        self._handled: set[int] = set()                         # pids already reported
        self._stop = threading.Event()

    def start(self) -> "Watchdog":
        threading.Thread(target=self._run, name="ddp-watchdog", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.check()
            except Exception as error:  # the watchdog must never take the agent down
                if not self._stop.is_set():  # once stopped, the agent removes what this was reading
                    self.say(f"ddp-launch: warning: hang watchdog: {error}")

    def read(self) -> list[Beat]:
        beats = []
        now = time.monotonic()
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:  # removed by the agent as the launch ends: nothing left to watch
            return []
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                rank = int(name[len("rank-"):-len(".json")])
                info = hb.read_info(self.directory, rank)
                record = self._record(rank, info["pid"])
            except (OSError, ValueError, KeyError):
                continue
            fields = hb.unpack(record[:hb.RECORD_SIZE])
            if fields is None:
                continue
            phase, _requests, _done, pid, step, buckets, when = fields
            # An earlier worker's record, or one caught mid-write or never stamped (a time of 0):
            # read it again next poll.
            if pid != info["pid"] or when <= 0:
                continue
            beats.append(Beat(rank, pid, info["node"], phase, step, buckets, now - when,
                              float(info["stall_after_s"]), process_state(pid), info["run_dir"],
                              int(info.get("main_thread") or 0)))
        return sorted(beats, key=lambda b: b.rank)

    def _record(self, rank: int, pid: int) -> mmap.mmap:
        held = self._records.get(rank)
        if held is None or held[0] != pid:
            fd = os.open(hb.record_path(self.directory, rank), os.O_RDWR)
            try:
                self._records[rank] = (pid, mmap.mmap(fd, hb.RECORD_SIZE))
            finally:
                os.close(fd)
        return self._records[rank][1]

    def check(self) -> None:
        beats = [b for b in self.read() if b.pid not in self._handled]
        stalled = [b for b in beats if b.stalled]
        if not stalled:
            return
        guilty = culprits(beats)
        if not guilty and len(stalled) < len([b for b in beats if b.state]):
            return  # a local rank still advances: wait until it too waits, or stops
        forensics = hb.forensics_dir(stalled[0].run_dir)
        ras = self.ask_ras(beats, guilty or stalled, forensics)  # while the stacks are written
        self.collect(beats, guilty, forensics)
        if guilty:
            for beat in guilty:
                stacks = _read(os.path.join(forensics, f"stacks-rank{beat.rank}.txt"))
                self.say(hang_line(beat, where_stopped(stacks, beat.main_thread), forensics))
            self.say(ras())
            for beat in guilty:
                _signal(beat.pid, signal.SIGKILL)  # its peers' collectives fail now, on every node
        else:
            self.say(waiting_line(stalled[0].node, stalled, forensics))
            self.say(ras())
        self._handled.update(b.pid for b in beats)

    def ask_ras(self, beats: Sequence[Beat], stalled: Sequence[Beat], forensics: str) -> Callable[[], str]:
        """Ask NCCL's RAS on a thread; the callable returns its line, waiting at most the budget."""
        budget = ras_budget_s(stalled)
        said: list[str] = []

        def ask() -> None:
            consulted = nccl_ras.consult(self.env, forensics, stalled[0].node, [b.pid for b in beats],
                                         [b.rank for b in stalled], budget)
            said.append(consulted.line)

        asking = threading.Thread(target=ask, name="ddp-watchdog-ras", daemon=True)
        started = time.monotonic()
        asking.start()

        def line() -> str:
            asking.join(max(0.0, budget + 1.0 - (time.monotonic() - started)))
            return "ddp-launch: " + (said[0] if said else
                                     f"NCCL RAS did not answer within {budget:.0f} s: no verdict from NCCL")
        return line

    def collect(self, beats: Sequence[Beat], guilty: Sequence[Beat], forensics: str) -> None:
        """Every local worker's stacks and Flight Recorder buffer, into the run directory."""
        os.makedirs(forensics, exist_ok=True)
        for beat in beats:
            record = self._records[beat.rank][1]
            record[hb.REQUEST_OFFSET] = (record[hb.REQUEST_OFFSET] + 1) % 256
            _signal(beat.pid, STACKS_SIGNAL)
            if beat.state == "T":
                # A stopped process takes the pending signal first when continued: its stacks
                # are where it stopped. It is killed right after.
                _signal(beat.pid, signal.SIGCONT)
        deadline = time.monotonic() + DUMP_WAIT_S
        pending = list(beats)
        while pending and time.monotonic() < deadline:
            time.sleep(0.2)
            pending = [b for b in pending if not _stacks_written(self.directory, b.rank)
                       or self._records[b.rank][1][hb.DONE_OFFSET] != self._records[b.rank][1][hb.REQUEST_OFFSET]]
        for beat in beats:
            source = hb.stacks_path(self.directory, beat.rank)
            if os.path.exists(source):
                shutil.copyfile(source, os.path.join(forensics, f"stacks-rank{beat.rank}.txt"))


def _stacks_written(directory: str, rank: int) -> bool:
    try:
        return os.path.getsize(hb.stacks_path(directory, rank)) > 0
    except OSError:
        return False


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def heartbeat_directory(base: str | None = None) -> str:
    """A fresh node-local directory for this agent's workers' heartbeats (memory-backed where it can)."""
    import tempfile
    parent = base or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    return tempfile.mkdtemp(prefix="ddp-heartbeat-", dir=parent)
