"""Each rank's step time split into compute and waiting in the gradient all-reduce; stragglers named.

DDP hands each gradient bucket to the all-reduce as soon as it is ready (a comm hook sees
it), and backward() returns only once every bucket is reduced. So the time from the last
bucket's hand-off to the end of backward is this rank waiting for its peers and the network;
so is, in eager mode, the time from the step's start to the model's own forward (DDP first
broadcasts its buffers, a collective); the rest of the step is its own compute. A slow rank computes longer and waits less; its
peers wait for it: its compute time, against the median over ranks, names it.

On CPU the marks are host clocks; on a GPU they are CUDA events on the compute stream, read
one sample later so nothing waits for the GPU, on one step in CUDA_SAMPLE_EVERY. Under CUDA
graphs nothing is timed (an event recorded during a capture is an error).
"""

from __future__ import annotations

import socket
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from ddp_train.errors import TrainError

# A rank (or node) whose median compute time per step is this much over the median of all
# ranks (or nodes) is named a straggler. In a synchronous job every step waits for the
# slowest rank, so a rank 20 % slow costs the whole job a sixth of its throughput: the
# slowdown against a run without it, the measure ByteDance's study of stragglers uses (Lin et
# al., "Understanding Stragglers in Large Model Training Using What-if Analysis", OSDI 2025,
# arXiv:2505.05713). Below it, identical CPU ranks sharing a busy node differ by chance
# (docs/benchmarks.md, "Hang and straggler forensics"): a lower threshold would name noise.
STRAGGLER_THRESHOLD = 0.20
CUDA_SAMPLE_EVERY = 10


@dataclass(frozen=True)
class RankTimes:
    """One rank's medians over the steps it timed, in milliseconds, and per epoch."""

    rank: int
    node: str
    steps: int
    step_ms: float
    compute_ms: float
    wait_ms: float
    step_ms_per_epoch: tuple[float, ...]


@dataclass(frozen=True)
class Straggler:
    who: str                # "rank 3 on node2" or "node node2"
    compute_ms: float
    median_ms: float
    waited_ms: float        # how long the others wait in the all-reduce, median per step

    @property
    def over(self) -> float:
        return self.compute_ms / self.median_ms - 1

    def line(self) -> str:
        return (f"Straggler: {self.who} computes {self.compute_ms:.1f} ms per step, {self.over:.0%} over the "
                f"others' median {self.median_ms:.1f} ms; the others wait {self.waited_ms:.1f} ms per step for it "
                f"in the gradient all-reduce")


class StepClock:
    """Marks a step's start, each bucket hand-off, the end of backward and the step's end."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.cuda = device.type == "cuda"
        self.enabled = enabled
        self.steps: list[tuple[float, float]] = []   # (step s, wait s) per timed step
        self.epoch_marks: list[int] = []             # len(steps) at each epoch's end
        self._timing = False
        self._count = 0
        self._marks: list[Any] = [0.0, 0.0, 0.0, 0.0, None]  # start, last bucket, backward end, step end,
        # and the model's own forward start, after DDP's buffer broadcast (eager mode only)
        self._pending: Optional[list[Any]] = None
        self._bucketed = False

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def begin(self) -> None:
        if not self.enabled:
            return
        self._count += 1
        self._timing = not self.cuda or self._count % CUDA_SAMPLE_EVERY == 0
        if self._timing:
            self._bucketed = False
            self._marks[0] = self._now()
            self._marks[4] = None

    def forward_started(self) -> None:
        if self._timing and self._marks[4] is None:
            self._marks[4] = self._now()

    def bucket(self) -> None:
        if self._timing:
            self._bucketed = True
            self._marks[1] = self._now()

    def backward_done(self) -> None:
        if self._timing:
            self._marks[2] = self._now()

    def end(self) -> None:
        if not self._timing:
            return
        self._timing = False
        self._marks[3] = self._now()
        if not self.cuda:
            self._add(self._marks)
            return
        self._read_pending()
        self._pending = list(self._marks)

    def _read_pending(self) -> None:
        if self._pending is not None and self._pending[3].query():
            self._add(self._pending)
        self._pending = None

    def _add(self, marks: Sequence[Any]) -> None:
        start, bucket, backward, end, forward = marks
        if self.cuda:
            step = start.elapsed_time(end) / 1000
            wait = bucket.elapsed_time(backward) / 1000 if self._bucketed else 0.0
            wait += start.elapsed_time(forward) / 1000 if forward is not None else 0.0
        else:
            step = end - start
            wait = backward - bucket if self._bucketed else 0.0
            wait += forward - start if forward is not None else 0.0
        self.steps.append((step, max(0.0, wait)))

    def epoch_end(self) -> None:
        if self.cuda and self._pending is not None:
            self._pending[3].synchronize()  # the epoch ended with a sync (.item()) anyway
            self._read_pending()
        self.epoch_marks.append(len(self.steps))

    def times(self, rank: int, node: str) -> Optional[RankTimes]:
        if not self.steps:
            return None
        steps = [s for s, _ in self.steps]
        waits = [w for _, w in self.steps]
        per_epoch, begin = [], 0
        for end in self.epoch_marks:
            if end > begin:
                per_epoch.append(round(statistics.median(steps[begin:end]) * 1000, 3))
            begin = end
        return RankTimes(rank, node, len(steps), statistics.median(steps) * 1000,
                         statistics.median(s - w for s, w in self.steps) * 1000,
                         statistics.median(waits) * 1000, tuple(per_epoch))


def stragglers(ranks: Sequence[RankTimes], threshold: float = STRAGGLER_THRESHOLD) -> list[Straggler]:
    """Ranks whose median compute is over the median of the others by more than threshold (pure).

    The others, not all: with two ranks the median of all is their mean. A node whose every
    rank (several) is slow alike is named once, as the node: a slow node, not four slow GPUs.
    A node with one rank far slower than the rest is not a slow node: its median would put a
    figure on every rank that none of them has, so each of its slow ranks is named.
    """
    slow = [r for r in ranks
            if _over(r.compute_ms, [o.compute_ms for o in ranks if o.rank != r.rank], threshold)]
    found = []
    for node in dict.fromkeys(r.node for r in slow):
        members = [r for r in ranks if r.node == node]
        others = [o for o in ranks if o.node != node]
        if len(members) > 1 and all(r in slow for r in members) and others \
                and _alike([r.compute_ms for r in members], threshold):
            found.append(Straggler(f"node {node}", statistics.median(r.compute_ms for r in members),
                                   statistics.median(o.compute_ms for o in others),
                                   statistics.median(o.wait_ms for o in others)))
            continue
        for r in (r for r in slow if r.node == node):
            rest = [o for o in ranks if o.rank != r.rank]
            found.append(Straggler(f"rank {r.rank} on {r.node}", r.compute_ms,
                                   statistics.median(o.compute_ms for o in rest),
                                   statistics.median(o.wait_ms for o in rest)))
    return found


def _alike(values: Sequence[float], threshold: float) -> bool:
    """Whether their median speaks for each: none is off it by more than the threshold."""
    median = statistics.median(values)
    return all(abs(value - median) <= median * threshold for value in values)


def _over(value: float, others: Sequence[float], threshold: float) -> bool:
    if not others:
        return False
    median = statistics.median(others)
    return median > 0 and value > median * (1 + threshold)


# A test-only switch: "RANK:SECONDS" makes that rank sleep so long in every step's compute
# (tests/e2e/test_forensics.py makes a straggler with it). Not a user setting.
TEST_SLOW_RANK_VAR = "DDP_TEST_SLOW_RANK"


def slowdown_s_for_tests(env: Mapping[str, str], rank: int) -> float:
    raw = env.get(TEST_SLOW_RANK_VAR, "")
    if not raw:
        return 0.0
    who, _, seconds = raw.partition(":")
    try:
        return float(seconds) if int(who) == rank else 0.0
    except ValueError:
        raise TrainError(f"{TEST_SLOW_RANK_VAR}={raw!r} is not RANK:SECONDS (a test-only switch): "
                         f"unset it") from None


@dataclass(frozen=True)
class StepTimes:
    """Every rank's step times (rank 0 holds them all) and the stragglers among them."""

    ranks: tuple[RankTimes, ...]
    found: tuple[Straggler, ...]

    def record(self) -> dict[str, Any]:
        return {"step_times": [asdict(r) for r in self.ranks],
                "stragglers": [{**asdict(s), "over": round(s.over, 4)} for s in self.found]}

    def lines(self) -> tuple[str, ...]:
        if not self.ranks:
            return ()
        if not self.found:
            compute = [r.compute_ms for r in self.ranks]
            return (f"Step time per rank: compute {min(compute):.1f} to {max(compute):.1f} ms, no straggler "
                    f"(none over the median by {STRAGGLER_THRESHOLD:.0%})",)
        return tuple(s.line() for s in self.found)


def gather(clock: StepClock, rank: int) -> StepTimes:
    """Every rank's medians, gathered (a collective: every rank calls it)."""
    from ddp_train import distributed
    mine = clock.times(rank, socket.gethostname())
    every = [t for t in distributed.all_gather_objects(mine) if t is not None]
    every.sort(key=lambda t: t.rank)
    return StepTimes(tuple(every), tuple(stragglers(every)))
