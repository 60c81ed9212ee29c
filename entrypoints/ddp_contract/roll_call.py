"""Which node went away when a collective failed: a roll call in the rendezvous store.

A node that drops off the network leaves its peers blocked in a collective until the process
group's timeout (--dist-timeout-s); one that dies resets their connections at once. Either
way gloo and NCCL say only that a receive timed out or a connection closed, not whose. So
every rank whose collective failed writes its name into the store (hosted by torchrun's
agent on the head node) and waits ROLL_CALL_S for the others: the ranks that never answer
are on the node that is gone, and the first rank done with the roll call says so in one line.
A rank that cannot reach the store itself has lost the head node, and names it.

The first verdict is written to the store too. A rank blocked on a live peer (gloo's ring:
rank 0 waits on rank 1, which left the collective for its roll call) only fails when that
peer exits, one roll call later; it takes the verdict instead of waiting out a roll call of
its own, so the whole job ends about ROLL_CALL_S after the first failure, well inside the
time srun gives the other tasks once one has ended (ddp.sh: srun --wait). The first verdict can
therefore name such a live node beside the lost one, when its ranks were still blocked on the
roll-calling peer as the wait ran out (seen on a loaded 2-core machine); the job script quarantines
a named node only where its slurmd no longer runs a step of `true` either (slurm/lib/ddp.sh,
ddp::replace_lost_node), so the spare replaces the lost node alone.

The rank that says the verdict also writes it for the job script, <run-dir>/roll-call.json (the
lost nodes, the cause, when the collective failed and when the roll call named them): a lost node
goes into the quarantine record, and the job script trains on a spare in its place
(slurm/lib/ddp.sh, DDP_SPARE_NODES). Ranks that died on a live node make no report: that is a crash,
not a lost node. Nor does a node whose launcher stopped the step with a line of its own (a usage error
of its rank 0: ddp_contract.launcher_reports): its silence, and its store's, are that error, which the
line names instead.

The trainer's (ddp_train.safety.peers) and a user's script's (ddp_contract.workload): no torch at import;
the store is the process group's, which a process that called this has.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from ddp_contract import NODE_NAME_VAR, RENDEZVOUS_STARTED_VAR, ROLL_CALL_REPORT, launcher_reports

# A trainer started without ddp-launch (srun python -m ddp_train) has no DDP_NODE_NAME: SLURM's name
# for the node (srun(1), OUTPUT ENVIRONMENT VARIABLES) is still the one the quarantine and ExcNodeList need.
SLURMD_NODENAME = "SLURMD_NODENAME"
ROLL_CALL_S = 15.0  # every live rank fails within this of the first (they share the timeout)
KEY = "ddp-train/roll-call/{rank}"
PRINTED_KEY = "ddp-train/roll-call/printed"
VERDICT_KEY = "ddp-train/roll-call/verdict"


def node_name(env: Mapping[str, str]) -> str:
    """This node as its job names it: DDP_NODE_NAME, which ddp-launch derives from the scheduler
    (SLURM's SLURMD_NODENAME, the name the quarantine and ExcNodeList need; a pod's name), else
    SLURMD_NODENAME for a trainer started without ddp-launch, else the host name."""
    return env.get(NODE_NAME_VAR) or env.get(SLURMD_NODENAME) or socket.gethostname()


def missing_nodes(hosts: Sequence[str], answered: Sequence[int]) -> dict[str, list[int]]:
    """{host: its ranks} for the hosts with a rank that did not answer."""
    silent: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if rank not in answered:
            silent.setdefault(host, []).append(rank)
    return silent


def gone_nodes(silent: dict[str, list[int]], hosts: Sequence[str]) -> list[str]:
    """The nodes none of whose ranks answered: lost. A node with a rank that answered is up."""
    return [host for host in silent if len(silent[host]) == list(hosts).count(host)]


def checkpoint_kept(checkpoint: str) -> str:
    """What a line says of the run's checkpoint: `checkpoint` names it, "" where none was written yet (a
    failure at the fabric gate or in the first epoch), and then a resubmission starts the run again."""
    return f"the last checkpoint ({checkpoint}) is kept" if checkpoint else "no checkpoint was written yet"


def what_to_do(checkpoint: str) -> str:
    return ("resubmit or requeue the job to resume from it" if checkpoint
            else "resubmit or requeue the job to start it again")


def lost_message(silent: dict[str, list[int]], hosts: Sequence[str], waited_s: float, cause: str,
                 checkpoint: str) -> str:
    """A node none of whose ranks answered is lost. Where every node has a rank that answered,
    the silent ranks died (killed, out of memory: their own logs say why). A silent rank on a
    node that is lost too is not named: it may be blocked behind a peer that died. `checkpoint`: ""
    where none was written yet (checkpoint_kept)."""
    def ranks(host: str) -> str:
        listed = silent[host]
        return f"rank{'s' if len(listed) > 1 else ''} {', '.join(map(str, listed))}"

    gone = gone_nodes(silent, hosts)
    if gone:
        what = (f"lost contact with {', '.join(f'{h} ({ranks(h)})' for h in gone)}: no answer {waited_s:.0f} s "
                f"after a collective failed ({cause}); the node dropped off the network or died")
    else:
        what = (f"{', '.join(f'{ranks(h)} on {h}' for h in silent)} stopped answering while every node is up "
                f"(killed or crashed: see that rank's log) after a collective failed ({cause})")
    kept = checkpoint_kept(checkpoint)
    return f"{what}. {kept[0].upper()}{kept[1:]}: {what_to_do(checkpoint)}, on other nodes if a node stays down"


def head_lost_message(head: str, cause: str, checkpoint: str) -> str:
    return (f"lost contact with the head node {head} (its rendezvous store does not answer) after a "
            f"collective failed ({cause}); {checkpoint_kept(checkpoint)}: {what_to_do(checkpoint)}")


def head_node(head: str, hosts: Sequence[str]) -> str:
    """The head's node name: MASTER_ADDR may be its address (ddp-launch passes the head's IPv4)."""
    if head in hosts:
        return head
    for host in dict.fromkeys(hosts):
        try:
            if socket.gethostbyname(host) == head:
                return host
        except OSError:
            continue
    return head


def roll_call_report(lost: dict[str, list[int]], cause: str, failed_at: float, message: str) -> dict:
    """roll-call.json: the lost nodes with their ranks, the cause, the collective's failure and the
    verdict's time (seconds since the epoch: the job script measures the recovery from them)."""
    return {"lost": [{"node": node, "ranks": ranks} for node, ranks in lost.items()], "cause": cause,
            "failed_at": round(failed_at, 3), "named_at": round(time.time(), 3), "message": message}


def write_report(run_dir: str | Path, report: dict, program: str = "ddp-train") -> None:
    """Written aside and renamed, so the job script never reads half of one; one rank per node may
    write it (a lost head), each through a file of its own."""
    path = Path(run_dir) / ROLL_CALL_REPORT
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(report) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:  # the line on stderr still names the node; the job script falls back to exit 1
        print(f"{program}: warning: cannot write {path} ({exc.strerror}): the job script cannot put a spare "
              f"in the lost node's place", flush=True)


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:160] if lines else type(exc).__name__


# How long a rank that lost the store waits for the report of a launcher that stopped on its own error:
# written as that launcher exits, and a shared file system may show it a moment later.
STOPPED_REPORT_WAIT_S = 3.0


def stopped_instead(run_dir: Optional[str], nodes: Sequence[str], me: str, env: Mapping[str, str],
                    wait_s: float = 0.0) -> Optional[dict]:
    """The report of a launcher among `nodes` that stopped the step with a line of its own, or None."""
    if not run_dir:
        return None
    since = float(env.get(RENDEZVOUS_STARTED_VAR) or 0)
    found = launcher_reports.wait_for_stopped_first(run_dir, me, since, wait_s)
    return found if found is not None and found.get("node") in nodes else None


def stopped_message(report: dict, cause: str, checkpoint: str) -> str:
    return (f"{launcher_reports.stopped_line(report)}; this rank's collective failed with it ({cause}); "
            f"{checkpoint_kept(checkpoint)}")


class Verdict(NamedTuple):
    """A roll call that found ranks silent: the one line, whether this rank says it, and the report for the
    job script (only where a node is gone)."""

    message: str
    prints: bool
    report: Optional[dict] = None


def default_store() -> Any:
    import torch.distributed as dist  # the caller's process group: torch is loaded there
    return dist.distributed_c10d._get_default_store()


def roll_call(hosts: Sequence[str], rank: int, exc: BaseException, checkpoint: str, head: str,
              store: Any = None, wait_s: float = ROLL_CALL_S, run_dir: Optional[str] = None,
              env: Mapping[str, str] = os.environ) -> Optional[Verdict]:
    """After a failed collective: the Verdict naming the silent nodes, or None when every rank answered
    (then the failure is not a lost node and keeps its traceback). `checkpoint`: the one a resubmission
    resumes from, "" where none was written yet. `store`: the process group's (the rendezvous store)
    unless given. A silent node whose launcher stopped with a line of its own
    (in run_dir) is named with that line, and is no lost node."""
    cause = first_line(exc)
    failed_at = time.time()
    try:
        store = store if store is not None else default_store()
        store.set_timeout(datetime.timedelta(seconds=wait_s))
        store.set(KEY.format(rank=rank), "1")
        started = time.monotonic()
        answered: list[int] = []
        while True:
            if store.check([VERDICT_KEY]):  # a rank that failed earlier has named the node already
                return Verdict(store.get(VERDICT_KEY).decode(), prints=False)
            answered = [r for r in range(len(hosts)) if store.check([KEY.format(rank=r)])]
            if len(answered) == len(hosts) or time.monotonic() - started > wait_s:
                break
            time.sleep(0.5)
    except Exception:  # noqa: BLE001 - any store failure means the store's host is out of reach
        first_here = min(r for r, host in enumerate(hosts) if host == hosts[rank])
        node = head_node(head, hosts)
        stopped = stopped_instead(run_dir, [node], hosts[rank], env, STOPPED_REPORT_WAIT_S)
        if stopped is not None:  # the head's launcher ended the step with its error, and its store with it
            return Verdict(stopped_message(stopped, cause, checkpoint), prints=rank == first_here)
        message = head_lost_message(head, cause, checkpoint)
        return Verdict(message, prints=rank == first_here,
                       report=roll_call_report({node: [r for r, h in enumerate(hosts) if h == node]}, cause,
                                               failed_at, message))
    silent = missing_nodes(hosts, answered)
    if not silent:
        return None
    stopped = stopped_instead(run_dir, gone_nodes(silent, hosts), hosts[rank], env)
    message = (stopped_message(stopped, cause, checkpoint) if stopped is not None
               else lost_message(silent, hosts, wait_s, cause, checkpoint))
    try:  # the first rank to finish its roll call says it and leaves it for the late ones
        first = store.add(PRINTED_KEY, 1) == 1
        if first:
            store.set(VERDICT_KEY, message)
    except Exception:  # noqa: BLE001 - the store went away meanwhile: say it from the lowest rank that answered
        first = rank == min(answered)
    gone = {node: silent[node] for node in gone_nodes(silent, hosts)} if stopped is None else {}
    return Verdict(message, prints=first, report=roll_call_report(gone, cause, failed_at, message) if gone else None)
