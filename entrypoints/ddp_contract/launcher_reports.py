"""What a node's ddp-launch leaves in the run directory when it ends on its own terms, for the other nodes.

<run-dir>/launcher-crash-<node>.json (ddp_contract.LAUNCHER_CRASH_REPORT) says the node is up and its
launcher ended the step: its workers were killed by a signal (exit -N), or it stopped with a line of
its own (a usage error, exit 2; a rendezvous port taken, exit 1), kept as "line". The other nodes read
it instead of guessing from what they see: their launcher's rendezvous store gone, their ranks' roll
call unanswered. Without it a usage error on the head node reads, on every other node, as a store that
failed (raise --rdzv-timeout) and as a lost head node. The job script removes these files before each
step (slurm/lib/ddp.sh); the quarantine reads them too (a node that wrote one is up).
Written aside and renamed, so no reader sees half of one. Python 3.6 (the quarantine runs on the host).
"""

import json
import os
import time
from typing import Dict, Mapping, Optional

from ddp_contract import LAUNCHER_CRASH_REPORT, NODE_NAME_VAR

RUN_DIR_VAR = "DDP_RUN_DIR"      # set by the job scripts for every step
# A report older than the reader's own start by more than this is an earlier step's (clocks of a
# cluster's nodes agree within seconds).
EARLIER_STEP_S = 120.0


def node_name(env: Mapping[str, str], hostname: str) -> str:
    return env.get(NODE_NAME_VAR) or hostname


def write(run_dir: str, node: str, exitcode: int, line: str = "", rank: Optional[int] = None,
          now: Optional[float] = None) -> Optional[str]:
    """Write this node's report; None, or the OSError's one line where it cannot be written."""
    path = os.path.join(run_dir, LAUNCHER_CRASH_REPORT.format(node=node))
    tmp = "{}.{}.tmp".format(path, os.getpid())
    record = {"node": node, "exitcode": exitcode, "at": round(time.time() if now is None else now, 3)}
    if rank is not None:
        record["rank"] = rank
    if line:
        record["line"] = line
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        os.replace(tmp, path)
    except OSError as error:
        return "cannot write {} ({})".format(path, error.strerror or error)
    return None


def read_all(run_dir: str) -> Dict[str, dict]:
    """{node: report} of the reports in run_dir that read as one."""
    prefix, suffix = LAUNCHER_CRASH_REPORT.split("{node}")
    found = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return found
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)):
            continue
        try:
            with open(os.path.join(run_dir, name), encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("exitcode"), int):
            found[name[len(prefix):len(name) - len(suffix)]] = record
    return found


def stopped_first(run_dir: str, besides: str, since: float) -> Optional[dict]:
    """The earliest report with a line of its own from a node other than `besides`, written since
    `since` (less EARLIER_STEP_S), or None."""
    said = [r for node, r in read_all(run_dir).items()
            if node != besides and r.get("line") and float(r.get("at", 0)) >= since - EARLIER_STEP_S]
    return min(said, key=lambda r: float(r.get("at", 0))) if said else None


def wait_for_stopped_first(run_dir: str, besides: str, since: float, wait_s: float,
                           poll_s: float = 0.5) -> Optional[dict]:
    """stopped_first, waited for up to wait_s: the other node writes its report as it exits, and a
    shared file system may show it a moment later here."""
    deadline = time.monotonic() + wait_s
    while True:
        found = stopped_first(run_dir, besides, since)
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)


def stopped_line(report: dict) -> str:
    """How another node names the one that stopped first, e.g. "nid001000's ddp-launch stopped first
    (exit 2): ddp-train: error: ..." """
    return "{}'s ddp-launch stopped first (exit {}): {}".format(report.get("node", "?"), report.get("exitcode"),
                                                               report.get("line", ""))
