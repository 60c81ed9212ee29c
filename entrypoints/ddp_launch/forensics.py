"""The Flight Recorder settings every launch gets where the user set none: the hang report's inputs.

PyTorch's Flight Recorder keeps a ring buffer of each rank's recent collectives and can dump
it when a collective times out (https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html,
https://pytorch.org/docs/stable/torch_nccl_environment_variables.html). torch 2.14 reads
TORCH_FR_BUFFER_SIZE, then TORCH_NCCL_TRACE_BUFFER_SIZE with a deprecation warning on every
rank (FlightRecorder.hpp, Utils.hpp), so the FR name is what we set; a torch older than the
rename (2.8) reads only the NCCL name, which a user of such an image sets (then ours is not). gloo records into the same buffer
but never dumps it itself: the trainer does, when ddp-launch's watchdog asks (watchdog.py).
The dump file's prefix belongs in the run directory, which only the trainer knows: it sets
TORCH_FR_DUMP_TEMP_FILE there where unset (ddp_train/safety/heartbeat.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ddp_launch.plan import EnvChange, LaunchPlan

BUFFER_ENTRIES = "2000"  # torch 2.14's own default where it enables the recorder: ~1 MB per rank

# (variable, its other names, value, reason): set only where none of the names is set.
FLIGHT_RECORDER = (
    ("TORCH_FR_BUFFER_SIZE", ("TORCH_NCCL_TRACE_BUFFER_SIZE",), BUFFER_ENTRIES,
     "Flight Recorder on (NCCL and gloo): the last 2000 collectives per rank, for the hang report"),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", (), "1",
     "Flight Recorder: NCCL's watchdog dumps it on a collective timeout, into <run-dir>/forensics"),
    ("TORCH_NCCL_ENABLE_MONITORING", (), "1",
     "the dump on timeout needs NCCL's heartbeat monitor (ProcessGroupNCCL.hpp)"),
)


def flight_recorder_env(env: Mapping[str, str]) -> tuple[EnvChange, ...]:
    """The Flight Recorder variables the user left unset (pure)."""
    return tuple(EnvChange(name, value, reason) for name, aliases, value, reason in FLIGHT_RECORDER
                 if not any(n in env for n in (name, *aliases)))


def env_sources(plan: LaunchPlan) -> str:
    """Who set each variable the plan sets, for the run's manifest: {name: "who: why"} as JSON.

    Each change says who (EnvChange.origin): the site profile, the fabric's defaults, or the
    launcher (the scheduler's plan and ours). A variable the workers have that is not here
    was set before ddp-launch ran: by the user or their job script.
    """
    sources = {change.name: f"{change.origin}: {change.reason}" for change in plan.changes
               if change.value is not None}
    return json.dumps(sources, separators=(",", ":"))
