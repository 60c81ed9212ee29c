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
time srun gives the other tasks once one has ended (ddp.sh: srun --wait).
"""

from __future__ import annotations

import datetime
import socket
import time
from typing import Optional, Sequence

import torch.distributed as dist

from ddp_train.errors import PeerLost

ROLL_CALL_S = 15.0  # every live rank fails within this of the first (they share the timeout)
KEY = "ddp-train/roll-call/{rank}"
PRINTED_KEY = "ddp-train/roll-call/printed"
VERDICT_KEY = "ddp-train/roll-call/verdict"


def hosts_by_rank() -> list[str]:
    """Every rank's host name, gathered once at the start (a collective)."""
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return [str(h) for h in hosts]


def missing_nodes(hosts: Sequence[str], answered: Sequence[int]) -> dict[str, list[int]]:
    """{host: its ranks} for the hosts with a rank that did not answer."""
    silent: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        if rank not in answered:
            silent.setdefault(host, []).append(rank)
    return silent


def lost_message(silent: dict[str, list[int]], hosts: Sequence[str], waited_s: float, cause: str,
                 checkpoint: str) -> str:
    """A node none of whose ranks answered is lost. Where every node has a rank that answered,
    the silent ranks died (killed, out of memory: their own logs say why). A silent rank on a
    node that is lost too is not named: it may be blocked behind a peer that died."""
    def ranks(host: str) -> str:
        listed = silent[host]
        return f"rank{'s' if len(listed) > 1 else ''} {', '.join(map(str, listed))}"

    gone = [host for host in silent if len(silent[host]) == list(hosts).count(host)]
    if gone:
        what = (f"lost contact with {', '.join(f'{h} ({ranks(h)})' for h in gone)}: no answer {waited_s:.0f} s "
                f"after a collective failed ({cause}); the node dropped off the network or died")
    else:
        what = (f"{', '.join(f'{ranks(h)} on {h}' for h in silent)} stopped answering while every node is up "
                f"(killed or crashed: see that rank's log) after a collective failed ({cause})")
    return (f"{what}. The last checkpoint ({checkpoint}) is kept: resubmit or requeue the job to resume "
            f"from it, on other nodes if a node stays down")


def head_lost_message(head: str, cause: str, checkpoint: str) -> str:
    return (f"lost contact with the head node {head} (its rendezvous store does not answer) after a "
            f"collective failed ({cause}); the last checkpoint ({checkpoint}) is kept: resubmit or "
            f"requeue the job to resume from it")


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:160] if lines else type(exc).__name__


def roll_call(hosts: Sequence[str], rank: int, exc: BaseException, checkpoint: str, head: str,
              store: Optional[dist.Store] = None, wait_s: float = ROLL_CALL_S) -> Optional[PeerLost]:
    """After a failed collective: PeerLost naming the silent nodes, or None when every rank answered
    (then the failure is not a lost node and keeps its traceback). `store`: the process group's
    (the rendezvous store) unless given."""
    cause = first_line(exc)
    try:
        store = store if store is not None else dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=wait_s))
        store.set(KEY.format(rank=rank), "1")
        started = time.monotonic()
        answered: list[int] = []
        while True:
            if store.check([VERDICT_KEY]):  # a rank that failed earlier has named the node already
                return PeerLost(store.get(VERDICT_KEY).decode(), prints=False)
            answered = [r for r in range(len(hosts)) if store.check([KEY.format(rank=r)])]
            if len(answered) == len(hosts) or time.monotonic() - started > wait_s:
                break
            time.sleep(0.5)
    except Exception:  # noqa: BLE001 - any store failure means the store's host is out of reach
        first_here = min(r for r, host in enumerate(hosts) if host == hosts[rank])
        return PeerLost(head_lost_message(head, cause, checkpoint), prints=rank == first_here)
    silent = missing_nodes(hosts, answered)
    if not silent:
        return None
    message = lost_message(silent, hosts, wait_s, cause, checkpoint)
    try:  # the first rank to finish its roll call says it and leaves it for the late ones
        first = store.add(PRINTED_KEY, 1) == 1
        if first:
            store.set(VERDICT_KEY, message)
    except Exception:  # noqa: BLE001 - the store went away meanwhile: say it from the lowest rank that answered
        first = rank == min(answered)
    return PeerLost(message, prints=first)
