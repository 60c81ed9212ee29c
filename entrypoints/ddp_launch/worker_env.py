"""A worker's ranks, agreed whichever variables its workload reads, before the workload runs.

torchrun gives each worker its place in the world (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, GROUP_WORLD_SIZE: https://docs.pytorch.org/docs/stable/elastic/run.html, "Environment
Variables"), but under SLURM its workers also inherit the variables srun set for the one task that runs
torchrun on the node: SLURM_PROCID is the node's task id, SLURM_LOCALID 0, SLURM_NTASKS the number of
nodes (srun(1), OUTPUT ENVIRONMENT VARIABLES). A script written for srun (ranks from SLURM_PROCID,
SLURM_LOCALID and SLURM_NTASKS, as many cluster guides teach) then runs as several separate jobs whose
ranks collide: on one node with 4 workers, four runs as rank 0 of 1, each on cuda:0, without an error.

So in every torchrun worker, SLURM's task variables are set to the worker's own place, as srun would
set them had it started one task per worker: SLURM_PROCID=RANK, SLURM_LOCALID=LOCAL_RANK,
SLURM_NTASKS (and SLURM_NPROCS, SLURM_STEP_NUM_TASKS)=WORLD_SIZE, SLURM_NODEID=GROUP_RANK,
SLURM_NTASKS_PER_NODE=LOCAL_WORLD_SIZE, SLURM_TASKS_PER_NODE and SLURM_STEP_TASKS_PER_NODE its
"L(xN)" form, SLURM_GTIDS this node's ranks. The node's name, its node list and the job's id stay
SLURM's: they are true for every worker. Where one task already is one worker (ddp-launch's slurm-task
mode sets RANK from SLURM_PROCID), the two agree, and a process where they do not (a RANK set by hand
beside srun's) stops before its workload runs, in one line naming the variable.

A script that sets MASTER_ADDR itself (the same guides compute it from the node list) must name the
node where rank 0 runs: under torchrun that is the node torchrun put first (its c10d rendezvous orders
the nodes by host name), which is the node list's first in most clusters' naming and not in every one.
Where a workload sets MASTER_ADDR to another node, env:// would wait for a store nobody hosts until its
timeout; instead the assignment stops every rank in one line (PEP 578 audit hook on os.putenv, which
os.environ's writes go through: https://docs.python.org/3/library/audit_events.html). MASTER_PORT is
the script's to choose: ddp-launch has rank 0 host the store for a user's workload (torchrun_command,
SEPARATE_STORE_VAR), as env:// does without a launcher.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable, Mapping

from ddp_launch.schedulers import task_as_worker

TORCHRUN_RUN_VAR = "TORCHELASTIC_RUN_ID"
# What a scheduler's table (schedulers.task_as_worker) may name besides torchrun's own variables.
LAYOUT, NODE_RANKS = "LAYOUT", "NODE_RANKS"
# torch's variables that one process started alone by a scheduler's task must agree on with the task's.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE")


def _number(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def worker_values(env: Mapping[str, str]) -> dict[str, str] | None:
    """torchrun's say of this worker's place, with LAYOUT and NODE_RANKS, or None where it is not a worker's."""
    known = {name: _number(env, name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                    "GROUP_RANK", "GROUP_WORLD_SIZE")}
    rank, local, world, local_world = (known[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    if None in (rank, local, world, local_world):
        return None
    values = {name: str(value) for name, value in known.items() if value is not None}
    values[NODE_RANKS] = ",".join(str(rank - local + i) for i in range(local_world))
    groups = known["GROUP_WORLD_SIZE"]
    if groups is not None and local_world * groups == world:
        values[LAYOUT] = f"{local_world}(x{groups})" if groups > 1 else str(local_world)
    return values


def scheduler_variables_for_worker(env: Mapping[str, str], table: Mapping[str, str] | None = None
                                   ) -> tuple[dict[str, str], str | None]:
    """(the scheduler's task variables to set in this torchrun worker, or a one-line problem): those the
    scheduler set, each to the worker's value. Nothing outside a torchrun worker, or where none is set."""
    table = task_as_worker() if table is None else table
    present = [name for name in table if name in env]
    if not env.get(TORCHRUN_RUN_VAR) or not present:
        return {}, None
    values = worker_values(env)
    if values is None:
        return {}, None  # not torchrun's variables: the workload's own check says what is missing
    changes = {}
    for name in present:
        said = table[name]
        if said not in values:
            return {}, (f"{name}={env[name]!r} cannot be said for this worker: torchrun's WORLD_SIZE="
                        f"{env.get('WORLD_SIZE')} is not LOCAL_WORLD_SIZE={env.get('LOCAL_WORLD_SIZE')} on each of "
                        f"GROUP_WORLD_SIZE={env.get('GROUP_WORLD_SIZE')} nodes; give every node the same "
                        f"--nproc-per-node")
        changes[name] = values[said]
    return changes, None


def disagreement(env: Mapping[str, str], table: Mapping[str, str] | None = None) -> str | None:
    """Outside torchrun: the first of torch's rank variables that the scheduler's task says otherwise."""
    if env.get(TORCHRUN_RUN_VAR):
        return None
    table = task_as_worker() if table is None else table
    for name, said in table.items():
        if said in RANK_VARIABLES and said in env and name in env and env[said] != env[name]:
            return (f"{said}={env[said]} but {name}={env[name]}: a script that reads either would take another "
                    f"rank than its peers; start the workload with ddp-launch in the task (it sets {said} from "
                    f"{name}), or unset {said}")
    return None


# -- MASTER_ADDR set by the workload ------------------------------------------------------------

def addresses(name: str, resolve: Callable[[str], set[str]] | None = None) -> set[str]:
    """Every address name resolves to here (empty: it does not)."""
    if resolve is not None:
        return resolve(name)
    try:
        return {info[4][0] for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return set()


def _here(found: set[str], own: set[str]) -> bool:
    """Whether these addresses are this node's: a loopback one (Debian's 127.0.1.1 for its own name), or one
    of its own name's."""
    return any(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in found) or bool(found & own)


def same_node(given: str, expected: str, resolve: Callable[[str], set[str]] | None = None) -> bool | None:
    """Whether two host names or addresses name one node, from here; None when `expected` does not resolve."""
    if given == expected:
        return True
    theirs, ours = addresses(given, resolve), addresses(expected, resolve)
    if not ours:
        return None
    if not theirs:
        return False
    own = addresses(socket.gethostname(), resolve)
    return bool(theirs & ours) or (_here(theirs, own) and _here(ours, own))


def master_addr_problem(value: str, env: Mapping[str, str],
                        resolve: Callable[[str], set[str]] | None = None) -> str | None:
    """One line when the workload sets MASTER_ADDR to a node that does not host rank 0 of a world of several
    nodes (the launcher's MASTER_ADDR names the one that does); None when it names that node, or when one
    node is the whole world (rank 0 runs here, and any of its names reaches it)."""
    expected = env.get("MASTER_ADDR", "")
    world, local_world = _number(env, "WORLD_SIZE"), _number(env, "LOCAL_WORLD_SIZE")
    if not expected or world is None or local_world is None or world <= local_world:
        return None
    same = same_node(value, expected, resolve)
    if same is not False:
        return None
    return (f"the workload set MASTER_ADDR={value}, but rank 0 hosts this job's rendezvous on {expected} "
            f"(ddp-launch's MASTER_ADDR; torchrun orders the nodes by host name): every rank would wait for a "
            f"store nobody hosts there until its timeout; leave MASTER_ADDR to ddp-launch (env:// reads it), or "
            f"set it only where it is unset (os.environ.setdefault)")


def guard_master_addr(env: Mapping[str, str], say: Callable[[str], None], exit_code: int) -> Callable:
    """The audit hook that judges the workload's own MASTER_ADDR as it is set (installed once, before the
    workload; it costs one comparison per audited event afterwards)."""
    launcher_env = dict(env)

    def hook(event: str, args: tuple) -> None:
        if event != "os.putenv" or not args:
            return
        key = args[0].decode(errors="replace") if isinstance(args[0], bytes) else str(args[0])
        if key != "MASTER_ADDR":
            return
        value = args[1].decode(errors="replace") if isinstance(args[1], bytes) else str(args[1])
        problem = master_addr_problem(value, launcher_env)
        if problem:
            say(problem)
            raise SystemExit(exit_code)

    sys.addaudithook(hook)
    return hook
