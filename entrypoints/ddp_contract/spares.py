"""Which nodes of the allocation train and which wait as spares (the job scripts' DDP_SPARE_NODES),
and what the batch script tells the trainer when a spare takes a bad node's place.

The allocation is N + S nodes (sbatch --nodes); the training runs on the first N healthy nodes in
the allocation's order, the rest are spares. A node is unhealthy while the run dir's quarantine
record names it (quarantine.json: the preflight, the fabric gate or a roll call named it). Taking the
first N healthy nodes again after a fault keeps every surviving node where it was and adds the next
healthy spare, so a recovery moves nothing but the bad node's ranks. Fewer than N healthy nodes:
the job script falls back to what it does without spares (the requeue without the bad nodes).
Each job script states the nodes it trains on (DDP_TRAIN_NODES, its #SBATCH --nodes); spares come on
top, so an allocation with no room for them beside those nodes is a usage mistake, said before any
step (`check`), not a job that silently trains on fewer nodes with the same global batch.
Runs on the host's python3 (3.6 on SLES 15):
    python3 -m ddp_contract.spares check ALLOCATED SPARES TRAIN_NODES [--job ID]
    python3 -m ddp_contract.spares place RUN_DIR SPARES [--previous CSV] [--named-at T]
        [--step-ended-at T] [--roll-call REPORT] NODE...
check: the settings as the job script has them (DDP_SPARE_NODES, DDP_TRAIN_NODES) against the job's
node count; exit 2 with one line when they do not fit, else nothing.
NODE...: the allocation in SLURM's order (scontrol show hostnames "$SLURM_JOB_NODELIST"); CSV: the
nodes the training used before (default: the first N, where it would have run); T: seconds since
the epoch. It prints four lines: train=CSV, healthy=CSV, recovery=JSON (empty when no training node
was replaced), say=LINE; exit 1 with one line when fewer than N healthy nodes are left, 2 for a
usage mistake.
"""

import argparse
import json
import sys
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ddp_contract import EXIT_USAGE
from ddp_contract import quarantine

# The job's node count, spares included (sbatch(1), OUTPUT ENVIRONMENT VARIABLES): this runs in the
# SLURM job script on the host (slurm/lib/ddp.sh), before any launch, so it reads SLURM's own name.
SLURM_JOB_NUM_NODES = "SLURM_JOB_NUM_NODES"


class Placement(NamedTuple):  # NamedTuple, not a dataclass: Python 3.6 on login nodes
    train: Tuple[str, ...]    # the N nodes that train, in the allocation's order
    healthy: Tuple[str, ...]  # every node of the allocation outside the quarantine record
    spares: Tuple[str, ...]   # the healthy nodes that do not train


class Swap(NamedTuple):
    node: str    # the training node taken out
    by: str      # who named it: doctor, gate, roll-call
    why: str
    spare: str   # the node that trains in its place


def training_count(allocation: Sequence[str], spares: int) -> int:
    """N = the allocation minus the spares; a usage mistake (ValueError) unless 0 <= S < allocation."""
    if spares < 0 or spares >= len(allocation):
        raise ValueError("DDP_SPARE_NODES={} leaves no node to train on in an allocation of {} node(s): ask for "
                         "more nodes (sbatch --nodes=N+S, N training nodes plus S spares; DDP_TRAIN_NODES=N makes the "
                         "job check it) or fewer spares".format(
                             spares, len(allocation)))
    return len(allocation) - spares


def node_count(name: str, value: str, least: int, fix: str) -> int:
    """A setting that counts nodes, as the job script passes it (a string); ValueError names it and the fix."""
    text = value.strip()
    if not text.isdigit() or int(text) < least:
        raise ValueError("{}={} is not a number of nodes{}: {}".format(
            name, value, " of at least {}".format(least) if least else "", fix))
    return int(text)


def allocation_problem(allocated: int, spares: int, train_nodes: int, job: str = "?") -> Optional[str]:
    """Why the job's allocation has no room for the spares beside the nodes its script trains on, or
    None. The spares come on top (sbatch --nodes=N+S): forgetting the +S would otherwise train on N-S
    nodes with the global batch meant for N, and leave the rest idle. More nodes than N+S train on
    more, as sbatch --nodes=K without spares trains on K."""
    if spares == 0 or allocated >= train_nodes + spares:
        return None
    fewer = allocated - spares
    alternative = ", or set DDP_TRAIN_NODES={} to train on {} node(s) with this allocation".format(
        fewer, fewer) if fewer >= 1 else ""
    return ("DDP_SPARE_NODES={}: job {} has {} node(s), too few for the {} the job script trains on "
            "(DDP_TRAIN_NODES={}) plus {} spare(s): submit with sbatch --nodes={}{}".format(
                spares, job, allocated, train_nodes, train_nodes, spares, train_nodes + spares, alternative))


def check(allocated: str, spares: str, train_nodes: str, job: str = "?") -> Optional[str]:
    """check's answer: one line when the settings are malformed or the allocation lacks room, else None."""
    try:
        count = node_count("DDP_SPARE_NODES", spares, 0, "set it to 0 (no spares) or to the spare nodes' count, "
                           "and submit with sbatch --nodes=N+S")
        have = node_count(SLURM_JOB_NUM_NODES, allocated, 1, "run the job script under sbatch")
        if not train_nodes.strip():  # a job script of one's own that does not say: at least one node trains
            training_count(range(have), count)
            return None
        train = node_count("DDP_TRAIN_NODES", train_nodes, 1, "set it to the nodes the training runs on "
                           "(the job script's #SBATCH --nodes)")
    except ValueError as error:
        return str(error)
    return allocation_problem(have, count, train, job)


def place(allocation: Sequence[str], spares: int, bad: Sequence[str]) -> Optional[Placement]:
    """The first N healthy nodes train; None when fewer than N are healthy."""
    need = training_count(allocation, spares)
    healthy = tuple(node for node in allocation if node not in set(bad))
    if len(healthy) < need:
        return None
    return Placement(healthy[:need], healthy, healthy[need:])


def swaps(previous: Sequence[str], now: Placement, record: Sequence[quarantine.Excluded]) -> Tuple[Swap, ...]:
    """Each training node taken out, paired in order with the spare that took its place."""
    named = {entry.node: entry for entry in record}
    gone = [node for node in previous if node not in now.train]
    added = [node for node in now.train if node not in previous]
    out = []
    for node, spare in zip(gone, added):
        entry = named.get(node)
        out.append(Swap(node, entry.by if entry else "?", entry.why if entry else "?", spare))
    return tuple(out)


def shortage_line(allocation: Sequence[str], spares: int, bad: Sequence[str], record: Sequence[quarantine.Excluded]) -> str:
    named = {entry.node: entry.by.replace("-", " ") for entry in record}
    out = [node for node in allocation if node in set(bad)]
    return ("no spare left: the training needs {} node(s) and {} of the allocation's {} are healthy after "
            "excluding {} (DDP_SPARE_NODES={})".format(
                training_count(allocation, spares), len(allocation) - len(out), len(allocation),
                ", ".join("{} (named by the {})".format(node, named.get(node, "?")) for node in out), spares))


def say(now: Placement, done: Sequence[Swap], allocation: Sequence[str]) -> str:
    """The job output's line for a placement: who replaced whom, where the training runs, what is left."""
    left = "{} spare(s) left{}".format(len(now.spares), ": " + ",".join(now.spares) if now.spares else "")
    where = "training on {} ({} of the allocation's {} nodes), {}".format(
        ",".join(now.train), len(now.train), len(allocation), left)
    if not done:
        return where
    replaced = "; ".join("spare {} replaces {} (named by the {}: {})".format(
        s.spare, s.node, s.by.replace("-", " "), s.why) for s in done)
    return "{}: {}".format(replaced, where)


def fault_times(roll_call: Optional[dict], named_at: Optional[float]) -> Tuple[Optional[float], Optional[float]]:
    """(when the fault showed, when a check named the node): a roll call knows both (its collective
    failed, then it named the silent node); the preflight and the gate only when they named it."""
    if roll_call:
        failed, named = roll_call.get("failed_at"), roll_call.get("named_at")
        if isinstance(failed, (int, float)) and isinstance(named, (int, float)):
            return float(failed), float(named)
    return named_at, named_at


def recovery(done: Sequence[Swap], fault_at: Optional[float], named_at: Optional[float],
             step_ended_at: Optional[float], step_started_at: float) -> Dict[str, object]:
    """What the trainer needs to record the recovery (ddp_contract.RECOVERY_VAR): the swaps and the
    fault's times, against which it measures its own start."""
    return {"swaps": [s._asdict() for s in done], "fault_at": fault_at, "named_at": named_at,
            "old_step_ended_at": step_ended_at, "step_started_at": step_started_at}


def read_report(path: Optional[str]) -> Optional[dict]:
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ddp_contract.spares")
    sub = parser.add_subparsers(dest="command")
    checking = sub.add_parser("check")
    for name in ("allocated", "spares", "train_nodes"):
        checking.add_argument(name)
    checking.add_argument("--job", default="?")
    placing = sub.add_parser("place")
    placing.add_argument("run_dir")
    placing.add_argument("spares", type=int)
    placing.add_argument("nodes", nargs="+")
    placing.add_argument("--previous", default="")
    placing.add_argument("--named-at", type=float, default=None)
    placing.add_argument("--step-ended-at", type=float, default=None)
    placing.add_argument("--roll-call", default=None)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    if args.command == "check":
        problem = check(args.allocated, args.spares, args.train_nodes, args.job)
        if problem:
            print(problem)
            return EXIT_USAGE
        return 0
    allocation: List[str] = list(args.nodes)
    try:
        need = training_count(allocation, args.spares)
        record = quarantine.read_record(args.run_dir)
    except ValueError as error:
        print(str(error))
        return EXIT_USAGE
    bad = [entry.node for entry in record if entry.node in allocation]
    now = place(allocation, args.spares, bad)
    if now is None:
        print(shortage_line(allocation, args.spares, bad, record))
        return 1
    previous = [n for n in args.previous.split(",") if n] or allocation[:need]
    done = swaps(previous, now, record)
    fault_at, named_at = fault_times(read_report(args.roll_call), args.named_at)
    print("train=" + ",".join(now.train))
    print("healthy=" + ",".join(now.healthy))
    print("recovery=" + (json.dumps(recovery(done, fault_at, named_at, args.step_ended_at, time.time()))
                         if done else ""))
    print("say=" + say(now, done, allocation))
    return 0


if __name__ == "__main__":
    sys.exit(main())
