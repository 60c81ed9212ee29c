"""The fabric gate's arithmetic and judgement, without torch: what each rank contributes, what the
sum must be, bandwidth as nccl-tests defines it, which nodes are tested together, and the verdict.

run.py runs the collectives; everything it decides is decided here, so it is unit-tested.
Bandwidth (nccl-tests doc/PERFORMANCE.md, https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
algbw = S / t, and for all-reduce busbw = algbw * 2(n-1)/n, the figure comparable to the
hardware's bandwidth whatever the rank count.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence

GATE_JSON = "gate.json"
GATE_TEXT = "gate.txt"
MiB = 2**20

# Every element a rank contributes is an integer in 1..PATTERN_PERIOD. Any partial sum of n ranks is
# then an integer <= PATTERN_PERIOD * n, exact in float32 (24-bit significand) in any reduction
# order while PATTERN_PERIOD * n <= 2**24: up to 2M ranks.
PATTERN_PERIOD = 8
MAX_EXACT_RANKS = 2**24 // PATTERN_PERIOD

# Sizes per device: the GPU sizes bracket a DDP bucket (25 MiB) and end at 128 MiB, the size of
# CSCS's published Slingshot figure; the CPU (gloo) sizes stay small so the gate costs seconds.
DEFAULT_SIZES = {"cuda": (1 * MiB, 16 * MiB, 128 * MiB), "cpu": (64 * 2**10, 1 * MiB, 4 * MiB)}
DEFAULT_ITERS = {"cuda": 20, "cpu": 5}
# With no published figure, a pair of nodes is slow below this share of the median pair. A bad
# node or a socket fallback costs 10-20x (CSCS: 5.4 vs 122.6 GB/s at 128 MiB); 4x leaves room for
# the noise of a shared machine. The median, not the fastest: one pair that happened to run alone
# on a loaded fabric (measured: 0.613 GB/s against a median of 0.205 among seven pairs) would
# otherwise raise the floor for all of them, while a bad node, in one pair of each round, never
# holds the median of half the pairs.
RELATIVE_FLOOR = 0.25


def contribution(rank: int, index: int) -> int:
    """What `rank` puts at element `index`: 1..PATTERN_PERIOD, shifted by the rank, so a missing,
    doubled or misplaced contribution changes the sum."""
    return 1 + (rank + index) % PATTERN_PERIOD


def expected_sum(ranks: Sequence[int], index: int) -> int:
    """The exact all-reduce sum at element `index` over the given ranks."""
    return sum(contribution(rank, index) for rank in ranks)


def expected_period(ranks: Sequence[int]) -> tuple[int, ...]:
    """expected_sum for one period of elements: the sum repeats every PATTERN_PERIOD elements."""
    if len(ranks) > MAX_EXACT_RANKS:
        raise ValueError(f"{len(ranks)} ranks: the pattern's sum is exact in float32 only up to {MAX_EXACT_RANKS}")
    return tuple(expected_sum(ranks, index) for index in range(PATTERN_PERIOD))


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    """nccl-tests' algorithm bandwidth in GB/s (10**9 bytes per second)."""
    return size_bytes / seconds / 1e9 if seconds > 0 else 0.0


def busbw_gbps(size_bytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth for all-reduce: algbw * 2(n-1)/n (0 for one rank: nothing moves)."""
    return algbw_gbps(size_bytes, seconds) * 2 * (ranks - 1) / ranks if ranks > 0 else 0.0


@dataclass(frozen=True)
class SizeResult:
    """One size of one group: the row nccl-tests prints (size, time, algbw, busbw, #wrong)."""
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int

    @classmethod
    def measured(cls, size_bytes: int, seconds: float, ranks: int, wrong: int) -> "SizeResult":
        return cls(size_bytes, seconds * 1e6, algbw_gbps(size_bytes, seconds),
                   busbw_gbps(size_bytes, seconds, ranks), wrong)

    def line(self) -> str:
        return (f"{human_size(self.size_bytes):>9}  {self.time_us:12.1f} us  algbw {self.algbw_gbps:8.3f} GB/s  "
                f"busbw {self.busbw_gbps:8.3f} GB/s  #wrong {self.wrong}")


def human_size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", MiB), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class GroupResult:
    """One group's all-reduces in one round: the whole world, one node, or a pair of nodes."""
    round: str                 # "world", "node", "pairs-1", ...
    nodes: tuple[str, ...]
    ranks: int
    sizes: tuple[SizeResult, ...]

    @property
    def wrong(self) -> int:
        return sum(s.wrong for s in self.sizes)

    @property
    def largest(self) -> SizeResult:
        return max(self.sizes, key=lambda s: s.size_bytes)

    @property
    def label(self) -> str:
        return "+".join(self.nodes)


@dataclass(frozen=True)
class Expectation:
    """The bus bandwidth a site's fabric should reach, with its source (the site profile's fabric_gate),
    and the backend and device it was measured with (nccl-tests: NCCL on GPUs)."""
    size_bytes: int
    busbw_gbps: float
    floor_fraction: float
    source: str
    sockets_busbw_gbps: Optional[float] = None
    backend: str = "nccl"
    device: str = "cuda"

    @property
    def floor_gbps(self) -> float:
        return self.busbw_gbps * self.floor_fraction


def expectation_from_profile(data: Optional[Mapping[str, object]]) -> Optional[Expectation]:
    """The site profile's "fabric_gate" object as an Expectation (None: judge relative to the other nodes)."""
    if not data:
        return None
    sockets = data.get("sockets_busbw_gbps")
    return Expectation(int(data["size_bytes"]), float(data["busbw_gbps"]), float(data["floor_fraction"]),
                       str(data["source"]), float(sockets) if sockets is not None else None,
                       str(data["backend"]), str(data["device"]))


# Where a site publishes no figure, an RDMA fabric still states its own: each port's rate, the active
# width times the active speed ("rate: ... e.g. '100 Gb/sec (4X EDR)'", the kernel's sysfs ABI,
# Documentation/ABI/stable/sysfs-class-infiniband). It bounds a pair of nodes' all-reduce busbw (nccl-tests
# doc/PERFORMANCE.md: busbw is the figure to compare with the hardware's peak bandwidth), and NCCL reaches most
# of it; a link that runs at a fraction of it (a port negotiated down, PFC or ECN misconfigured on RoCE, a
# GPU far from its NIC) falls below a floor set with the same margin as RELATIVE_FLOOR's. So two nodes, or two
# pods, are judged where the SLURM sites' published figure judges them, and where no third node could.
LINK_FLOOR = RELATIVE_FLOOR
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


def port_rate_gbits(text: str) -> Optional[float]:
    """A port's sysfs rate ("100 Gb/sec (4X EDR)") in Gb/s, or None when it says none."""
    match = _RATE.match(text or "")
    return float(match.group(1)) if match and float(match.group(1)) > 0 else None


def link_expectation(rates_gbits: Mapping[str, Optional[float]], size_bytes: int) -> Optional[Expectation]:
    """The expectation from every node's RDMA link rate (Gb/s, the ports NCCL uses, summed): the slowest node's
    rate as bus bandwidth, which no pair with it can pass. None where a node has no RDMA rate (no figure)."""
    if not rates_gbits or any(rate is None for rate in rates_gbits.values()):
        return None
    slowest = min(rates_gbits.values())
    listed = ", ".join(f"{node} {rate:g} Gb/s" for node, rate in sorted(rates_gbits.items()))
    return Expectation(size_bytes, slowest / 8, LINK_FLOOR,
                       f"the RDMA links' rate, sysfs ports/<p>/rate ({listed}): the slowest as bus bandwidth")


NOT_JUDGED = "bandwidth reported, not judged"


def judged_expectation(expectation: Optional[Expectation], nodes: int, backend: str,
                       device: str, pairs: bool = True) -> tuple[Optional[Expectation], tuple[str, ...]]:
    """The site's published figure where it can judge this gate, else None and a note saying why.

    A published all-reduce figure is a fabric's, between nodes (CSCS: 2 nodes x 4 GH200): within one
    node the ranks talk over NVLink or shared memory, and one rank moves nothing (busbw = 0 by
    nccl-tests' definition), so it judges only a world of two nodes or more. And it holds only for
    the backend and device it was measured with: gloo on CPU workers is not NCCL on GPUs.
    With no figure that applies, three nodes or more are still judged against each other, where the
    gate may build its pair groups (pairs; a site can forbid them: subgroups_refused).
    """
    if expectation is None:
        why = "no published bus bandwidth for this site"
    elif nodes < 2:
        why = (f"the site's published {expectation.busbw_gbps:g} GB/s is between nodes and this gate ran "
               f"within one node")
    elif (backend, device) != (expectation.backend, expectation.device):
        why = (f"the site's published {expectation.busbw_gbps:g} GB/s was measured with {expectation.backend} "
               f"on {expectation.device} and this gate ran {backend} on {device}")
    else:
        return expectation, ()
    if nodes >= 3 and pairs:
        return None, (f"{why}: the nodes are judged against each other",)
    if nodes >= 3:
        return None, (f"{why} and no pair rounds to compare the nodes: {NOT_JUDGED}",)
    return None, (f"{why} and fewer than 3 nodes to compare: {NOT_JUDGED}",)


def subgroups_refused(site: Optional[str], allowed: Optional[bool], source: str = "") -> Optional[str]:
    """Why the gate builds no process group but the world's (the site profile's gate_subgroups), or None.

    The node and pair rounds each need a group of their own (torch.distributed.new_group), and a
    second group is where some stacks hang with no timeout (lumi-ai-factory/laifs-container-recipes#44):
    there the gate measures the world alone, so it cannot wedge in a subgroup, and a failure it
    cannot narrow names no node rather than one a hang happened to fall on."""
    if allowed is None or allowed:
        return None
    return (f"no node or pair rounds: site {site} builds no process group but the world's, so a failure here "
            f"names no node ({source})")


# -- which nodes are tested together ------------------------------------------------------

def pair_rounds(nodes: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Disjoint pairs of node indexes per round: round k pairs i with i XOR 2**k (a butterfly).

    ceil(log2 n) rounds; every pair in a round runs at once, so a round costs one pair's time,
    and each node meets a different partner in every round, which tells a bad node (slow with
    every partner) from a bad link (slow with one).
    """
    rounds = []
    step = 1
    while step < nodes:
        pairs = tuple((i, i ^ step) for i in range(nodes) if i < i ^ step < nodes)
        rounds.append(pairs)
        step *= 2
    return tuple(rounds)


# -- judging ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    """A node or a link the gate names, with the figures that name it."""
    kind: str                  # "corrupt" | "slow" | "sockets"
    nodes: tuple[str, ...]     # one node, or the two ends of a link
    measured: str
    expected: str
    cause: str

    @property
    def what(self) -> str:
        return f"node {self.nodes[0]}" if len(self.nodes) == 1 else f"link {self.nodes[0]}-{self.nodes[1]}"

    def line(self) -> str:
        return f"{self.what}: {self.measured} (expected {self.expected}); likely cause: {self.cause}"


CORRUPT_CAUSE = ("the all-reduce returned wrong data: a faulty GPU or NIC, or a protocol bug "
                 "(LL128 on GH200 with Slingshot, NVIDIA/nccl#2001)")
SLOW_CAUSE = ("a slow NIC or link on that node, a fallback to TCP sockets there "
              "(no net plugin or HCA on one node: NVIDIA/nccl#1634, NVIDIA/nccl#2428), or a congested port")


def corrupt_faults(groups: Iterable[GroupResult]) -> list[Fault]:
    """Nodes whose own group (one node's ranks) returned wrong elements."""
    return [Fault("corrupt", g.nodes, f"{g.wrong} wrong element(s) in {len(g.sizes)} all-reduce(s) within the node",
                  "0 wrong", CORRUPT_CAUSE) for g in groups if g.wrong and len(g.nodes) == 1]


def slow_threshold(pairs: Sequence[GroupResult], expectation: Optional[Expectation]) -> tuple[float, str]:
    """(floor in GB/s, how it was set) for a pair's busbw at its largest size."""
    if expectation is not None:
        return expectation.floor_gbps, (f"{expectation.floor_gbps:.1f} GB/s = {expectation.floor_fraction:g} x "
                                        f"{expectation.busbw_gbps:g} GB/s ({expectation.source})")
    # median_high: with two pairs (three nodes) the third node is judged against the other pair.
    middle = statistics.median_high(g.largest.busbw_gbps for g in pairs)
    return middle * RELATIVE_FLOOR, (f"{middle * RELATIVE_FLOOR:.3f} GB/s = {RELATIVE_FLOOR:g} x the median pair "
                                     f"({middle:.3f} GB/s)")


def slow_pairs(pairs: Sequence[GroupResult], expectation: Optional[Expectation]) -> list[GroupResult]:
    """The pairs below the floor at their largest size."""
    if not pairs:
        return []
    floor, _ = slow_threshold(pairs, expectation)
    return [g for g in pairs if g.largest.busbw_gbps < floor]


def rounds_to_repeat(pairs: Sequence[GroupResult], expectation: Optional[Expectation]) -> list[str]:
    """The pair rounds to measure again before any node is named: those with a pair below the floor.

    A gate that excludes a node costs that node, and a requeue where no spare is left; one slow
    measurement can be a moment, not a node (a rank descheduled on a shared CPU, a burst of other
    traffic on a port), while a bad NIC or a socket fallback is slow every time. So a pair is judged
    by the fastest of up to PAIR_MEASUREMENTS measurements (faster_of, remeasured): each further round
    for the suspects costs one pair's time, and a pass costs nothing more."""
    return sorted({g.round for g in slow_pairs(pairs, expectation)})


# How often a pair below the floor is measured in all before it is named. Two were not enough on a
# 2-core machine running six nodes' ranks: one healthy pair measured 0.025, then 0.071 GB/s against a
# floor of 0.082 (its median pair 0.329), its ranks descheduled both times; a slow link is slow every time.
PAIR_MEASUREMENTS = 3


def remeasured(pairs: Sequence[GroupResult], expectation: Optional[Expectation],
               measure_round: Callable[[str], Sequence[GroupResult]]) -> tuple[list[GroupResult], tuple[str, ...]]:
    """The pairs as judged: the rounds with a pair below the floor measured again (measure_round(name)),
    while one stays below it and at most PAIR_MEASUREMENTS times in all, each pair at its fastest; and
    faster_of's notes for every measurement after the first."""
    kept, notes = list(pairs), ()
    for _ in range(PAIR_MEASUREMENTS - 1):
        again = [result for name in rounds_to_repeat(kept, expectation) for result in measure_round(name)]
        if not again:
            break
        kept, said = faster_of(kept, again)
        notes = (*notes, *said)
    return kept, notes


def faster_of(first: Sequence[GroupResult], again: Sequence[GroupResult]) -> tuple[list[GroupResult], tuple[str, ...]]:
    """Each pair at the faster of its two measurements (by busbw at the largest size), and a note for
    each pair measured again, with both figures."""
    second = {g.nodes: g for g in again}
    kept, notes = [], []
    for g in first:
        other = second.get(g.nodes)
        if other is None:
            kept.append(g)
            continue
        kept.append(max((g, other), key=lambda r: r.largest.busbw_gbps))
        notes.append(f"{g.label} measured again: busbw {g.largest.busbw_gbps:.3f} then {other.largest.busbw_gbps:.3f} "
                     f"GB/s at {human_size(g.largest.size_bytes)}; the faster is judged")
    return kept, tuple(notes)


def blame_pairs(pairs: Sequence[GroupResult], expectation: Optional[Expectation]) -> list[Fault]:
    """Name the slow nodes and links from the pair rounds.

    A pair below the floor is slow. A node in a slow pair that was also in a fast pair is cleared;
    a slow pair with one end cleared names the other end; with both ends cleared it names the link;
    with neither cleared it names both ends (two nodes can only be told apart by a third).
    """
    if not pairs:
        return []
    _, how = slow_threshold(pairs, expectation)
    slow = slow_pairs(pairs, expectation)
    cleared = {node for g in pairs if g not in slow for node in g.nodes}
    faults: dict[tuple[str, ...], Fault] = {}
    for g in slow:
        suspects = tuple(n for n in g.nodes if n not in cleared)
        blamed = suspects if len(suspects) == 1 else g.nodes if not suspects else ()
        figures = f"busbw {g.largest.busbw_gbps:.3f} GB/s at {human_size(g.largest.size_bytes)} between {g.label}"
        if len(suspects) == 1 or not suspects:
            faults.setdefault(blamed, Fault("slow", blamed, figures, f">= {how}", SLOW_CAUSE))
        else:
            for node in suspects:  # neither end cleared: both stay suspects, each named
                faults.setdefault((node,), Fault("slow", (node,), figures, f">= {how}", SLOW_CAUSE))
    return list(faults.values())


def world_below_floor(world: GroupResult, expectation: Optional[Expectation]) -> Optional[str]:
    """Why the whole-world all-reduce fails the published figure, or None."""
    if expectation is None:
        return None
    at = [s for s in world.sizes if s.size_bytes == expectation.size_bytes] or [world.largest]
    measured = at[0]
    if measured.busbw_gbps >= expectation.floor_gbps:
        return None
    return (f"busbw {measured.busbw_gbps:.2f} GB/s at {human_size(measured.size_bytes)} is below the floor "
            f"{expectation.floor_gbps:.1f} GB/s ({expectation.floor_fraction:g} x {expectation.busbw_gbps:g} GB/s, "
            f"{expectation.source})")


# -- the report ----------------------------------------------------------------------------

@dataclass(frozen=True)
class GateReport:
    """What the gate did and decided: written as gate.json and gate.txt in the run directory."""
    ok: bool
    verdict: str
    world: GroupResult
    rounds: tuple[GroupResult, ...] = ()
    faults: tuple[Fault, ...] = ()
    bad_nodes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    backend: str = ""
    expectation: Optional[Expectation] = None
    schema: int = field(default=1)

    def record(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        lines = [f"fabric gate: all-reduce on {self.world.ranks} ranks over {len(self.world.nodes)} node(s) "
                 f"({self.backend}), nccl-tests' busbw = algbw * 2(n-1)/n"]
        lines += [f"  {s.line()}" for s in self.world.sizes]
        for g in self.rounds:
            lines.append(f"  [{g.round}] {g.label} ({g.ranks} ranks): {g.largest.line()}")
        lines += [f"  note: {note}" for note in self.notes]
        lines += [f"  fault: {fault.line()}" for fault in self.faults]
        lines.append(self.verdict)
        return "\n".join(lines)


def verdict_line(ok: bool, world: GroupResult, faults: Sequence[Fault], problem: Optional[str],
                 seconds: float) -> str:
    """The one line: pass with the figures, or fail naming the node, measured vs expected, and the cause."""
    largest = world.largest
    figures = f"busbw {largest.busbw_gbps:.3f} GB/s at {human_size(largest.size_bytes)}, #wrong {world.wrong}"
    if ok:
        return f"fabric gate: PASS in {seconds:.1f} s on {len(world.nodes)} node(s), {world.ranks} ranks: {figures}"
    if faults:
        return f"fabric gate: FAIL in {seconds:.1f} s: " + "; ".join(f.line() for f in faults)
    return f"fabric gate: FAIL in {seconds:.1f} s ({figures}): {problem or 'see gate.txt'}"


def decide(world: GroupResult, node_groups: Sequence[GroupResult], pair_groups: Sequence[GroupResult],
           expectation: Optional[Expectation], sockets: Sequence[str], seconds: float,
           backend: str, notes: Sequence[str] = (), unnarrowed: Optional[str] = None) -> GateReport:
    """The verdict from every round's results. sockets: nodes whose NCCL fell back to TCP sockets
    where the fabric should be RDMA (always a failure, whatever the figures). unnarrowed: why no
    node or pair round ran (subgroups_refused), so a failure of the world names no node."""
    faults: list[Fault] = [Fault("sockets", (node,), "NCCL uses TCP sockets", "RDMA (the site's fabric)",
                                 "the NCCL net plugin or the HCA is missing on that node (NVIDIA/nccl#1634)")
                           for node in sockets] if sockets and len(sockets) < len(world.nodes) else []
    problem = None
    if sockets and len(sockets) == len(world.nodes):
        problem = ("NCCL uses TCP sockets on every node although the fabric should be RDMA: a setup problem, not a "
                   "node (check the site profile's binds: ddp-launch doctor)")
    faults += corrupt_faults(node_groups)
    faults += [f for f in blame_pairs(pair_groups, expectation) if f.nodes not in {x.nodes for x in faults}]
    below = world_below_floor(world, expectation)
    if not faults and world.wrong and problem is None:
        problem = (f"{world.wrong} wrong element(s) in the all-reduce over all nodes, not reproduced by any node or pair"
                   if unnarrowed is None else
                   f"{world.wrong} wrong element(s) in the all-reduce over all nodes, not narrowed to a node: {unnarrowed}")
    if not faults and below and problem is None:
        problem = below if unnarrowed is None else f"{below}; not narrowed to a node: {unnarrowed}"
    ok = not faults and problem is None
    bad_nodes = tuple(sorted({f.nodes[0] for f in faults if len(f.nodes) == 1}))
    verdict = verdict_line(ok, world, faults, problem, seconds)
    return GateReport(ok, verdict, world, tuple(node_groups) + tuple(pair_groups), tuple(faults), bad_nodes,
                      tuple(notes), seconds, backend, expectation)


def needs_narrowing(world: GroupResult, expectation: Optional[Expectation], sockets: Sequence[str],
                    nodes: int) -> bool:
    """Whether to run the node and pair rounds: on any failure, or always where only a comparison of the
    nodes can judge (no published figure and at least three nodes to compare)."""
    if world.wrong or sockets or world_below_floor(world, expectation):
        return True
    return expectation is None and nodes >= 3


def write_report(report: GateReport, run_dir: str) -> None:
    import os
    os.makedirs(run_dir, exist_ok=True)
    for name, text in ((GATE_JSON, json.dumps(report.record(), indent=2) + "\n"), (GATE_TEXT, report.text() + "\n")):
        tmp = os.path.join(run_dir, f".{name}.tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, os.path.join(run_dir, name))
