"""The run directory's record of bad nodes, kept across requeues, and what the batch script asks of it.

A node that the fabric gate (gate.json), the preflight (`ddp-launch doctor --json`, one
report per node) or the trainer's roll call after a failed collective (roll-call.json: a node lost
mid-run) names goes into <run-dir>/quarantine.json with why; the batch script trains on a spare
node instead (ddp_contract.spares) or requeues the job with those nodes in ExcNodeList. Runs on the
host's python3 (3.6 on SLES 15):
    python3 -m ddp_contract.quarantine add --by gate|doctor|roll-call --job ID --restart N RUN_DIR REPORT...
    python3 -m ddp_contract.quarantine exclude RUN_DIR     (comma-separated nodes, for ExcNodeList)
    python3 -m ddp_contract.quarantine show RUN_DIR        (one line per excluded node and why)
    python3 -m ddp_contract.quarantine enough RUN_DIR NEED NODE...   (exit 1 with one line when short)
"""

import argparse
import json
import os
import sys
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from ddp_contract import EXIT_BAD_NODE, EXIT_USAGE

RECORD_NAME = "quarantine.json"
DOCTOR_PREFIX = "doctor-"  # doctor-<node>.json, as the job script's srun --output=doctor-%N.json names them


class Excluded(NamedTuple):  # NamedTuple, not a dataclass: Python 3.6 on login nodes
    node: str
    by: str        # "gate" | "doctor" | "roll-call"
    why: str
    job: str
    restart: int

    def line(self) -> str:
        return "excluded {} (named by the {} in job {}, restart {}): {}".format(
            self.node, self.by.replace("-", " "), self.job, self.restart, self.why)


def record_path(run_dir: str) -> str:
    return os.path.join(run_dir, RECORD_NAME)


def parse_record(data: object) -> Tuple[Excluded, ...]:
    if not isinstance(data, dict) or not isinstance(data.get("excluded"), list):
        raise ValueError("not a quarantine record (an object with an 'excluded' list)")
    return tuple(Excluded(str(e["node"]), str(e["by"]), str(e["why"]), str(e["job"]), int(e["restart"]))
                 for e in data["excluded"])


def read_record(run_dir: str) -> Tuple[Excluded, ...]:
    """The nodes excluded so far (none when there is no record yet)."""
    try:
        with open(record_path(run_dir), encoding="utf-8") as handle:
            return parse_record(json.load(handle))
    except FileNotFoundError:
        return ()


def write_record(run_dir: str, excluded: Sequence[Excluded]) -> None:
    """Atomically: a crash while writing leaves the previous record, never half of one."""
    data = {"schema": 1, "excluded": [e._asdict() for e in excluded]}
    tmp = record_path(run_dir) + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, record_path(run_dir))


def merge(known: Sequence[Excluded], named: Sequence[Excluded]) -> Tuple[Tuple[Excluded, ...], Tuple[Excluded, ...]]:
    """(the whole record, the entries new to it): a node already excluded keeps its first reason."""
    have = {e.node for e in known}
    new = []
    for entry in named:
        if entry.node not in have:
            have.add(entry.node)
            new.append(entry)
    return tuple(known) + tuple(new), tuple(new)


def named_by_gate(report: object) -> Dict[str, str]:
    """{node: why} from gate.json: the nodes it blamed (a link between two cleared nodes names none)."""
    if not isinstance(report, dict):
        return {}
    named = {}
    for fault in report.get("faults") or ():
        nodes = fault.get("nodes") or []
        if len(nodes) == 1 and nodes[0] in (report.get("bad_nodes") or ()):
            named.setdefault(nodes[0], "{} (expected {}); likely cause: {}".format(
                fault.get("measured"), fault.get("expected"), fault.get("cause")))
    return named


def named_by_roll_call(report: object) -> Dict[str, str]:
    """{node: why} from roll-call.json: the nodes none of whose ranks answered (src/ddp_train/peers.py).
    The collective's own error (gloo's and NCCL's run to a source path and a cut-off line) stays in the
    report and in the trainer's line."""
    if not isinstance(report, dict):
        return {}
    named = {}
    for lost in report.get("lost") or ():
        if isinstance(lost, dict) and lost.get("node"):
            named[str(lost["node"])] = "lost mid-run: none of its ranks answered the roll call after a collective failed"
    return named


def named_by_doctor(node: str, text: str) -> Optional[str]:
    """Why the doctor failed this node, or None when it passed or left no report: a node that cannot
    run the image at all fails the fabric gate next, so a garbled file never excludes a node."""
    try:
        report = json.loads(text)
    except ValueError:
        print("preflight: no doctor report from {} (see doctor-{}.err): not excluding it on that".format(
            node, node), file=sys.stderr)
        return None
    if not isinstance(report, dict) or report.get("ok"):
        return None
    failed = [c for c in report.get("checks") or () if c.get("status") == "FAIL"]
    return "; ".join("{}: {}".format(c.get("name"), c.get("detail")) for c in failed) or "doctor failed"


# The checks that write one report for the whole job (the doctor writes one per node).
NAMED_BY_REPORT = {"gate": named_by_gate, "roll-call": named_by_roll_call}


def doctor_node(path: str) -> str:
    name = os.path.basename(path)
    return name[len(DOCTOR_PREFIX):-len(".json")] if name.startswith(DOCTOR_PREFIX) else name


def collect(by: str, reports: Iterable[str], job: str, restart: int) -> List[Excluded]:
    found = []
    for path in reports:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        if by in NAMED_BY_REPORT:
            try:
                named = NAMED_BY_REPORT[by](json.loads(text))
            except ValueError:
                named = {}
            found += [Excluded(node, by, why, job, restart) for node, why in sorted(named.items())]
        else:
            node = doctor_node(path)
            why = named_by_doctor(node, text)
            if why:
                found.append(Excluded(node, by, why, job, restart))
    return found


def shortage(excluded: Sequence[Excluded], need: int, nodes: Sequence[str]) -> Optional[str]:
    """One line when fewer than `need` of the partition's nodes are left once the excluded are out."""
    out = {e.node for e in excluded}
    healthy = [n for n in nodes if n not in out]
    if len(healthy) >= need:
        return None
    return ("out of healthy nodes: the job needs {} node(s), {} of the partition's {} are left after excluding {}: "
            "not requeuing; fix or drain those nodes, or submit with fewer nodes".format(
                need, len(healthy), len(nodes), ", ".join(sorted(out)) or "none"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m ddp_contract.quarantine")
    sub = parser.add_subparsers(dest="command")
    add = sub.add_parser("add")
    add.add_argument("run_dir")
    add.add_argument("--by", choices=("gate", "doctor", "roll-call"), required=True)
    add.add_argument("--job", default="?")
    add.add_argument("--restart", type=int, default=0)
    add.add_argument("reports", nargs="*")
    for name in ("exclude", "show"):
        sub.add_parser(name).add_argument("run_dir")
    enough = sub.add_parser("enough")
    enough.add_argument("run_dir")
    enough.add_argument("need", type=int)
    enough.add_argument("nodes", nargs="*")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    known = read_record(args.run_dir)
    if args.command == "add":
        record, new = merge(known, collect(args.by, args.reports, args.job, args.restart))
        if new:
            write_record(args.run_dir, record)
        for entry in new:
            print(entry.line())
        return EXIT_BAD_NODE if new else 0
    if args.command == "exclude":
        print(",".join(e.node for e in known))
        return 0
    if args.command == "show":
        for entry in known:
            print(entry.line())
        return 0
    problem = shortage(known, args.need, args.nodes)
    if problem:
        print(problem)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
