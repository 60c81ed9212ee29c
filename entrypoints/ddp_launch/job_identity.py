"""The job's identity as each scheduler module derives it, and the variables that carry it to the trainer.

Every scheduler module has identity(job, facts) -> JobIdentity: which job this is (the same on every
node, across its requeues and its containers' restarts) and this node's name in it, from that
scheduler's own variables. The planner exports both (DDP_JOB_ID, DDP_NODE_NAME), so the run-dir
lock (ddp_contract.rundir_lock) and the trainer read those and no scheduler's variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_contract import JOB_ID_VAR, NODE_NAME_VAR
from ddp_launch.plan import EnvChange


@dataclass(frozen=True)
class JobIdentity:
    job_id: str | None       # None: no scheduler names the job (a local run)
    job_source: str          # where it came from, for the plan's reason
    node_name: str | None    # this node (a SLURM node, a pod) as the job names it
    node_source: str
    file_name: str | None = None   # the job in a file's name (NCCL's log: nccl-<file_name>...); None: "local"


NO_IDENTITY = JobIdentity(None, "", None, "")


def identity_env(identity: JobIdentity, env: Mapping[str, str]) -> tuple[EnvChange, ...]:
    """DDP_JOB_ID and DDP_NODE_NAME for the workers, unless already set (a user's, or an outer
    launch's): kept, as every variable of the user's is."""
    changes = []
    if identity.job_id and not env.get(JOB_ID_VAR):
        changes.append(EnvChange(JOB_ID_VAR, identity.job_id,
                                 f"the job, from {identity.job_source}: its run-dir lock knows a restart of it"))
    if identity.node_name and not env.get(NODE_NAME_VAR):
        changes.append(EnvChange(NODE_NAME_VAR, identity.node_name, f"this node in the job, from {identity.node_source}"))
    return tuple(changes)
