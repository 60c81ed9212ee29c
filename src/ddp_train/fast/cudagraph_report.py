"""Whether the compiled step runs as a CUDA graph on each rank and, where it does not, inductor's
reason in one line: said after the warm-up and in the summary, never left to a silent slowdown.

Inductor decides per compiled graph and says why in one place, `log_cudagraph_skip_and_bump_counter`
in torch/_inductor/cudagraph_utils.py (read in torch 2.14.1): a WARNING "skipping cudagraphs due to
<reason>" on that module's `cudagraphs` artifact logger (torch/_logging/_internal.py names it
"<module>.__cudagraphs"), and `counters["inductor"]["cudagraph_skips"] += 1` from
torch/_dynamo/utils.py. A graph on a CPU device, or one a cudagraph policy keeps, only bumps the
counter (torch/_inductor/output_code.py). What was recorded is in the CUDA-graph tree manager
(torch/_inductor/cudagraph_trees.py, `get_manager(...).get_roots()`), a private API: read
defensively. The known case: BatchNorm under DDP with reduce-overhead skips graphs for
"mutated inputs" (https://github.com/pytorch/pytorch/issues/139207).
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

# The logger inductor's skip messages go to: getArtifactLogger("torch._inductor.cudagraph_utils",
# "cudagraphs"). Taken by name, so that a run that never compiles does not import inductor.
SKIP_LOGGER = "torch._inductor.cudagraph_utils.__cudagraphs"
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes with triton.cudagraphs on


def uses_cuda_graphs(mode: str) -> bool:
    return mode in CUDA_GRAPH_MODES
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')


class SkipWatch(logging.Handler):
    """Collects inductor's skip messages from the moment it is started (before the first compile)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.counted_before = skip_count()

    @classmethod
    def start(cls) -> "SkipWatch":
        watch = cls()
        logging.getLogger(SKIP_LOGGER).addHandler(watch)
        return watch

    def stop(self) -> None:
        logging.getLogger(SKIP_LOGGER).removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def skips_counted(self) -> int:
        return skip_count() - self.counted_before


def skip_count() -> int:
    """Inductor's own count of skipped graphs; 0 before anything compiled (nothing imported)."""
    utils = sys.modules.get("torch._dynamo.utils")
    return int(utils.counters["inductor"]["cudagraph_skips"]) if utils is not None else 0


def recorded_graph_count(device_index: int) -> Optional[int]:
    """CUDA graphs inductor's tree manager has recorded on this device; None where that private
    API is not as read here (another torch)."""
    try:
        from torch._inductor import cudagraph_trees
        manager = cudagraph_trees.get_manager(device_index, create_if_none_exists=False)
        if manager is None:
            return 0
        count, nodes = 0, list(manager.get_roots())
        while nodes:
            node = nodes.pop()
            count += 1
            for children in node.children.values():
                nodes.extend(children)
        return count
    except (AttributeError, ImportError, TypeError):
        return None


def one_line(message: str) -> str:
    """Inductor's message without its stack trace, pointing at the innermost frame instead:
    'skipping cudagraphs due to mutated inputs (2 instances), at model.py:41 in forward' (pure)."""
    head = message.strip().splitlines()[0].strip() if message.strip() else "(empty message)"
    head = re.sub(r"\.?\s*Found from\s*:?\s*$", "", head)
    frames = list(_FRAME.finditer(message))
    if frames:
        last = frames[-1]
        head += f", at {last['path'].rsplit('/', 1)[-1]}:{last['line']} in {last['func']}"
    return head


@dataclass(frozen=True)
class GraphState:
    """One rank's answer: on, partly, off, not used or unknown, with its one-line detail."""
    state: str
    detail: str

    def text(self) -> str:
        """'on (6 graph(s) recorded)', 'off: skipping cudagraphs due to ...'."""
        if self.state in ("off", "partly"):
            return f"{self.state}: {self.detail}"
        return f"{self.state} ({self.detail})"


def decide(device_type: str, compiled: bool, compile_mode: str, messages: Sequence[str],
           skips_counted: int, graphs_recorded: Optional[int]) -> GraphState:
    """This rank's state from what inductor said, counted and recorded (pure)."""
    if device_type != "cuda":
        return GraphState("not used", f"{device_type.upper()}: CUDA graphs need a GPU")
    if not compiled:
        return GraphState("not used", "not compiled (--no-compile)")
    if compile_mode not in CUDA_GRAPH_MODES:
        return GraphState("not used", f"--compile-mode {compile_mode} has none; "
                                      f"{' and '.join(CUDA_GRAPH_MODES)} have")
    if messages or skips_counted:
        distinct = list(dict.fromkeys(one_line(m) for m in messages))
        reason = distinct[0] if distinct else (f"inductor counted {skips_counted} skipped graph(s) and gave "
                                               f"no reason (its log is off: TORCH_LOGS?)")
        if len(distinct) > 1:
            reason += f" (and {len(distinct) - 1} other reason(s))"
        if graphs_recorded:
            return GraphState("partly", f"{graphs_recorded} graph(s) recorded; {reason}")
        return GraphState("off", reason)
    if graphs_recorded is None:
        return GraphState("unknown", "no skip reported, and this torch's graph trees could not be read")
    if graphs_recorded == 0:
        return GraphState("unknown", "no skip reported and no graph recorded yet")
    return GraphState("on", f"{graphs_recorded} graph(s) recorded")


def observe(device_type: str, device_index: Optional[int], compiled: bool, compile_mode: str,
            watch: Optional[SkipWatch]) -> GraphState:
    """This rank's state now: after the warm-up (graphs record on the warm-up's later passes)."""
    messages = tuple(watch.messages) if watch is not None else ()
    counted = watch.skips_counted() if watch is not None else 0
    recorded = 0
    if device_type == "cuda" and compiled:
        import torch
        recorded = recorded_graph_count(device_index if device_index is not None else torch.cuda.current_device())
    return decide(device_type, compiled, compile_mode, messages, counted, recorded)


def rank_ranges(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (pure)."""
    runs: list[list[int]] = []
    for rank in sorted(ranks):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return ",".join(f"{first}-{last}" if last > first else f"{first}" for first, last in runs)


@dataclass(frozen=True)
class GraphReport:
    """Every rank's state (rank 0 holds them all): its lines and its part of the summary record."""
    by_rank: tuple[GraphState, ...]

    def lines(self) -> tuple[str, ...]:
        groups: dict[GraphState, list[int]] = {}
        for rank, state in enumerate(self.by_rank):
            groups.setdefault(state, []).append(rank)
        if len(self.by_rank) == 1:
            return (f"CUDA graphs: {self.by_rank[0].text()}",)
        return tuple(f"CUDA graphs, rank{'s' if len(ranks) > 1 else ''} {rank_ranges(ranks)}: {state.text()}"
                     for state, ranks in groups.items())

    def record(self) -> dict[str, Any]:
        return {"cuda_graphs": [{"rank": rank, "state": s.state, "detail": s.detail}
                                for rank, s in enumerate(self.by_rank)]}


def gather(state: GraphState) -> GraphReport:
    """Every rank's state (a collective: every rank calls it)."""
    from ddp_train import distributed
    return GraphReport(tuple(distributed.all_gather_objects(state)))
