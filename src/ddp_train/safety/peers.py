"""Which node went away when a collective failed: ddp_contract.roll_call's roll call, as the trainer takes it.

The roll call itself (the store keys, the verdict, roll-call.json) is the contract's, which a user's own
script takes part in too (ddp_contract.workload); here are the trainer's two additions: every rank's node
gathered once at the start (a collective), and the verdict as the PeerLost its cli.py turns into one line.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence

import torch.distributed as dist

# The trainer's users of the roll call's pieces (train.py, its tests) take them from here.
from ddp_contract.roll_call import (ROLL_CALL_S, lost_message, missing_nodes, node_name, socket,  # noqa: F401
                                    write_report)
from ddp_contract import roll_call as contract
from ddp_train.errors import PeerLost


def hosts_by_rank(env: Mapping[str, str]) -> list[str]:
    """Every rank's node name, gathered once at the start (a collective)."""
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, node_name(env))
    return [str(h) for h in hosts]


def roll_call(hosts: Sequence[str], rank: int, exc: BaseException, checkpoint: str, head: str,
              store: Optional[dist.Store] = None, wait_s: float = ROLL_CALL_S, run_dir: Optional[str] = None,
              env: Mapping[str, str] = os.environ) -> Optional[PeerLost]:
    """After a failed collective: PeerLost naming the silent nodes, or None when every rank answered
    (then the failure is not a lost node and keeps its traceback)."""
    verdict = contract.roll_call(hosts, rank, exc, checkpoint, head, store, wait_s, run_dir, env)
    return None if verdict is None else PeerLost(verdict.message, verdict.prints, verdict.report)
