"""A training step that put spare nodes in bad nodes' places: its "recovery" record and one line.

The job script (slurm/lib/ddp.sh, DDP_SPARE_NODES) passes what it knows in DDP_RECOVERY
(ddp_contract.spares: the swaps, when the fault showed, when a check named the node, when the old
step ended, when it started the new one); the trainer adds the marks of its own start, and rank 0
writes the record to metrics.jsonl and says it in the job output as the first step is about to run.
The clocks are the nodes' wall clocks (time.time()): NTP keeps a cluster's within milliseconds.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional

from ddp_contract import RECOVERY_VAR, RENDEZVOUS_STARTED_VAR

if TYPE_CHECKING:
    from ddp_train.console import Console
    from ddp_train.metrics import MetricsWriter

# The marks, in order, and the part of the recovery that ends at each: the part is the time since
# the latest earlier mark that is known. A mark can be missing: a preflight or gate fault has no
# old step and no roll call, slurm-task mode has no torchrun agent.
PARTS = (
    ("named_at", "detection"),                   # the collective failed -> the roll call named the node
    ("old_step_ended_at", "old step's end"),     # -> srun of the failed step returned (srun --wait, KillWait)
    ("step_started_at", "job script"),           # -> the new step is started (quarantine, placement; a user script's gate)
    ("rendezvous_started_at", "new step's start"),  # -> ddp-launch's agent starts torchrun (srun, Apptainer)
    ("process_started_at", "rendezvous"),        # -> this worker process exists (torchrun's c10d rendezvous)
    ("group_ready_at", "process group"),         # -> imports, init_process_group
    ("gate_done_at", "fabric gate"),             # -> ddp-train --fabric-gate's rounds (where the job runs it)
    ("resume_started_at", "data and model"),     # -> the dataset on the device, the model built
    ("resume_done_at", "checkpoint load"),       # -> the checkpoint loaded
    ("training_at", "warm-up and compile"),      # -> DDP, the warm-up passes (compile, from its cache)
)


@dataclass(frozen=True)
class Swap:
    node: str
    by: str
    why: str
    spare: str


@dataclass(frozen=True)
class Recovery:
    swaps: tuple[Swap, ...]
    marks: Mapping[str, Optional[float]]  # the job script's: fault_at, named_at, old_step_ended_at, step_started_at


def from_env(env: Mapping[str, str]) -> Optional[Recovery]:
    """DDP_RECOVERY as the job script wrote it; None when unset or not what it writes."""
    text = env.get(RECOVERY_VAR)
    if not text:
        return None
    try:
        data = json.loads(text)
        swaps = tuple(Swap(str(s["node"]), str(s["by"]), str(s["why"]), str(s["spare"])) for s in data["swaps"])
        marks = {name: _seconds(data.get(name)) for name in ("fault_at", "named_at", "old_step_ended_at",
                                                              "step_started_at")}
    except (ValueError, KeyError, TypeError):
        return None
    return Recovery(swaps, marks) if swaps else None


def _seconds(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def process_start_time(proc: str = "/proc") -> Optional[float]:
    """When this process was created (proc(5): /proc/self/stat field 22, clock ticks after boot;
    /proc/stat btime, the boot in seconds since the epoch): its interpreter and imports included."""
    try:
        with open(os.path.join(proc, "self", "stat")) as handle:
            after_comm = handle.read().rsplit(")", 1)[1].split()
        with open(os.path.join(proc, "stat")) as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + int(after_comm[19]) / os.sysconf("SC_CLK_TCK")  # field 22 is the 20th after "(comm)"


@dataclass
class StartClock:
    """The marks of this process's start, filled in as it goes (run and train mark them)."""
    marks: dict = field(default_factory=dict)

    @classmethod
    def started(cls, env: Mapping[str, str]) -> "StartClock":
        clock = cls()
        clock.marks["rendezvous_started_at"] = _float(env.get(RENDEZVOUS_STARTED_VAR))
        clock.marks["process_started_at"] = process_start_time()
        return clock

    def mark(self, name: str) -> None:
        self.marks[name] = time.time()


def _float(text: Optional[str]) -> Optional[float]:
    try:
        return float(text) if text else None
    except ValueError:
        return None


# slurm-task mode has no torchrun agent: the step's start runs to the worker itself (ddp-launch execs
# it), and the rendezvous is the process group's own (env://, MASTER_ADDR).
WITHOUT_AGENT = {"process_started_at": "new step's start", "group_ready_at": "process group and rendezvous"}


def parts(marks: Mapping[str, Optional[float]]) -> list[tuple[str, float]]:
    """(part, seconds) for each mark that is known, from the one before it that is; the fault first."""
    out, last = [], marks.get("fault_at")
    for name, part in PARTS:
        at = marks.get(name)
        if at is None:
            continue
        if marks.get("rendezvous_started_at") is None:
            part = WITHOUT_AGENT.get(name, part)
        if last is not None:
            out.append((part, max(0.0, at - last)))
        last = at
    return out


def total_s(marks: Mapping[str, Optional[float]]) -> Optional[float]:
    start, end = marks.get("fault_at"), marks.get("training_at")
    return None if start is None or end is None else max(0.0, end - start)


def record(recovery: Recovery, clock: StartClock) -> dict[str, Any]:
    """The "recovery" record of metrics.jsonl."""
    marks = {**recovery.marks, **clock.marks}
    return dict(swaps=[vars(s) for s in recovery.swaps], seconds=_round(total_s(marks)),
                parts={part: round(seconds, 3) for part, seconds in parts(marks)},
                marks={name: _round(at) for name, at in marks.items()})


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 3)


def line(recovery: Recovery, clock: StartClock) -> str:
    """Which node was replaced, by which spare, and the seconds from the fault to training again."""
    marks = {**recovery.marks, **clock.marks}
    swapped = ", ".join(f"{s.node} (named by the {s.by.replace('-', ' ')}) by spare {s.spare}"
                        for s in recovery.swaps)
    total = total_s(marks)
    took = f"training again {total:.1f} s after the fault" if total is not None else "training again"
    detail = ", ".join(f"{part} {seconds:.1f} s" for part, seconds in parts(marks))
    return f"Recovered: replaced {swapped}; {took}" + (f" ({detail})" if detail else "")


def announce(env: Mapping[str, str], clock: StartClock, log: MetricsWriter, console: Console) -> None:
    """On rank 0, as the first step is about to run: the recovery's record and its line, when this is
    the first start of a step that spares joined."""
    recovered = from_env(env) if first_start(env) else None
    if recovered is not None:
        log.write("recovery", **record(recovered, clock))
        console.say(line(recovered, clock))


def first_start(env: Mapping[str, str]) -> bool:
    """torchrun's restart of the same step carries the same DDP_RECOVERY: one record per recovery."""
    return env.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0")
