"""The run directory's record of bad nodes, kept across requeues, and what the batch script asks of it.

A node that the fabric gate (gate.json), the preflight (`ddp-launch doctor --json`, one
report per node) or the trainer's roll call after a failed collective (roll-call.json: a node lost
mid-run) names goes into <run-dir>/quarantine.json with why (a node the roll call found silent whose
own launcher reported its workers' crash, launcher-crash-<node>.json, or whose slurmd the batch script
found answering, --up, is up and stays out of it); the batch script trains on a spare
node instead (ddp_contract.spares) or requeues the job with those nodes in ExcNodeList. A check that
fails on every node is the setup's, not a node's: `add` names nothing then, prints one line with
the fix and exits 2; otherwise it also prints each known problem the doctor warns about (a slowdown
of the node's stack: ddp_contract.known_issues), with the nodes that have it. Runs on the host's python3 (3.6 on SLES 15):
    python3 -m ddp_contract.quarantine add --by gate|doctor|roll-call --job ID --restart N [--nodes N] [--up NODE]... RUN_DIR REPORT...
    python3 -m ddp_contract.quarantine lost REPORT      (the nodes a roll call names, one a line)
    python3 -m ddp_contract.quarantine exclude RUN_DIR     (comma-separated nodes, for ExcNodeList)
    python3 -m ddp_contract.quarantine show RUN_DIR        (one line per excluded node and why)
    python3 -m ddp_contract.quarantine enough RUN_DIR NEED NODE...   (exit 1 with one line when short)
"""

import argparse
import json
import os
import sys
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ddp_contract import EXIT_BAD_NODE, EXIT_USAGE, HARDWARE_CHECKS, LAUNCHER_CRASH_REPORT

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
    """{node: why} from roll-call.json: the nodes none of whose ranks answered (src/ddp_train/safety/peers.py).
    The collective's own error (gloo's and NCCL's run to a source path and a cut-off line) stays in the
    report and in the trainer's line."""
    if not isinstance(report, dict):
        return {}
    named = {}
    for lost in report.get("lost") or ():
        if isinstance(lost, dict) and lost.get("node"):
            # An entry may say why itself: the job script's, for a node slurmctld stopped hearing first.
            named[str(lost["node"])] = str(lost.get("why") or
                                           "lost mid-run: none of its ranks answered the roll call after a collective failed")
    return named


def up_by_launcher(run_dir: str, named: Iterable[str]) -> List[str]:
    """The named nodes whose ddp-launch wrote that its workers crashed (ddp_launch/agent.py): the node
    was up to say so, so the silence of its ranks was a crash (killed workers, out of memory), not a
    lost node. The job script removes these records before each training step."""
    return [node for node in named
            if os.path.exists(os.path.join(run_dir, LAUNCHER_CRASH_REPORT.format(node=node)))]


class Failed(NamedTuple):  # one FAIL of a doctor report (ddp_launch.doctor.render_json)
    name: str
    detail: str
    fix: str


def doctor_failures(text: str) -> Optional[Tuple[Failed, ...]]:
    """The checks a node's doctor report FAILs (none when it passed), or None when the file is no
    report: a node that cannot run the image at all fails the fabric gate next."""
    try:
        report = json.loads(text)
    except ValueError:
        return None
    if not isinstance(report, dict):
        return None
    if report.get("ok"):
        return ()
    failed = tuple(Failed(str(c.get("name")), str(c.get("detail")), str(c.get("fix") or ""))
                   for c in report.get("checks") or () if isinstance(c, dict) and c.get("status") == "FAIL")
    return failed or (Failed("doctor", "failed", ""),)


# The doctor's known-issues checks ("known issue <id>", ddp_contract.known_issues.CHECK_PREFIX; that module
# is not imported here: it runs in the image, this on the host's Python 3.6).
KNOWN_ISSUE_PREFIX = "known issue "


def known_issue_warnings(texts: Mapping[str, str], what: str = "node") -> List[str]:
    """One line per known problem the doctor WARNs about (a slowdown, or a hang that needs a condition no
    version shows), with the nodes (what: "pod" in a pod's preflight) that match it: these train, and the
    job output must say so."""
    nodes: Dict[Tuple[str, str, str], List[str]] = {}
    for path, text in sorted(texts.items()):
        try:
            report = json.loads(text)
        except ValueError:
            continue
        for check in (report.get("checks") or ()) if isinstance(report, dict) else ():
            if (isinstance(check, dict) and check.get("status") == "WARN"
                    and str(check.get("name", "")).startswith(KNOWN_ISSUE_PREFIX)):
                key = (str(check["name"]), str(check.get("detail")), str(check.get("fix") or ""))
                nodes.setdefault(key, []).append(doctor_node(path))
    return ["preflight: warning: {} on {}: {}{}".format(
        name, what + " " + found[0] if len(found) == 1 else what + "s " + ", ".join(found), detail,
        "; fix: " + fix if fix else "") for (name, detail, fix), found in nodes.items()]


def named_by_doctor(node: str, failures: Optional[Tuple[Failed, ...]]) -> Optional[str]:
    """Why the doctor failed this node, or None when it passed or left no report (so a garbled file
    never excludes a node)."""
    if failures is None:
        print("preflight: no doctor report from {} (see doctor-{}.err): not excluding it on that".format(
            node, node), file=sys.stderr)
        return None
    return "; ".join("{}: {}".format(f.name, f.detail) for f in failures) or None


def setup_problem(failures: Mapping[str, Optional[Tuple[Failed, ...]]], nodes: int) -> Optional[str]:
    """One line when a check FAILs in the report of every node of the job: the image, the binds or a
    setting, which excluding nodes cannot fix. The fabric gate's rule for NCCL on TCP sockets is the
    same (src/ddp_train/gate/judge.py, decide: on every node, "a setup problem, not a node"), and,
    like it, it counts the only node of a 1-node job as every node: one node cannot tell a node's
    fault from the setup's, and a requeue cannot either, while it costs up to DDP_MAX_REQUEUES waits
    in the queue for a setup fault. The exception is a check of the node's own hardware
    (HARDWARE_CHECKS: an uncorrectable ECC error, a pending repair, a slowdown that held in two
    readings is that GPU's), which on one node is the node's: requeued without it, the job runs on
    a healthy one, while exit 2 would leave the user to find and exclude the node by hand.
    The line names the node, for an --exclude when it is the node."""
    reports = sorted(failures.items())
    if not reports or len(reports) < nodes or any(found is None for _, found in reports):
        return None
    common = [f for f in reports[0][1] if all(f.name in {g.name for g in found} for _, found in reports[1:])
              and (len(reports) > 1 or f.name not in HARDWARE_CHECKS)]
    if not common:
        return None
    first = common[0]
    if len(reports) > 1:
        where = "on every node of the job ({} of {})".format(len(reports), len(reports))
    else:
        where = "on the job's only node ({}; if the node is at fault, resubmit with sbatch --exclude={})".format(
            reports[0][0], reports[0][0])
    return ("preflight: ddp-launch doctor fails '{}' {}: {}: a setup problem, not a bad node, so nothing is "
            "excluded or requeued; fix: {}".format(first.name, where, first.detail,
                                                   first.fix or "see each node's doctor-<node>.json"))


# The checks that write one report for the whole job (the doctor writes one per node).
NAMED_BY_REPORT = {"gate": named_by_gate, "roll-call": named_by_roll_call}


def doctor_node(path: str) -> str:
    name = os.path.basename(path)
    return name[len(DOCTOR_PREFIX):-len(".json")] if name.startswith(DOCTOR_PREFIX) else name


def read_reports(paths: Iterable[str]) -> Dict[str, str]:
    """{path: text} of the reports that can be read."""
    texts = {}
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                texts[path] = handle.read()
        except OSError:
            continue
    return texts


def doctor_reports(texts: Mapping[str, str]) -> Dict[str, Optional[Tuple[Failed, ...]]]:
    """{node: its FAILs, or None when its file is no report}, from the doctor-<node>.json files."""
    return {doctor_node(path): doctor_failures(text) for path, text in texts.items()}


def collect(by: str, texts: Mapping[str, str], job: str, restart: int) -> List[Excluded]:
    found = []
    if by == "doctor":
        for node, failures in sorted(doctor_reports(texts).items()):
            why = named_by_doctor(node, failures)
            if why:
                found.append(Excluded(node, by, why, job, restart))
        return found
    for text in texts.values():
        try:
            named = NAMED_BY_REPORT[by](json.loads(text))
        except ValueError:
            named = {}
        found += [Excluded(node, by, why, job, restart) for node, why in sorted(named.items())]
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
    add.add_argument("--nodes", type=int, default=0, help="the job's node count (default: one per report)")
    add.add_argument("--up", action="append", default=[], metavar="NODE",
                     help="with --by roll-call: a node whose slurmd answered after the step: up, not lost")
    add.add_argument("reports", nargs="*")
    sub.add_parser("lost").add_argument("report")
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
    if args.command == "lost":
        texts = read_reports([args.report])
        for text in texts.values():
            try:
                print("\n".join(sorted(named_by_roll_call(json.loads(text)))))
            except ValueError:
                pass
        return 0
    known = read_record(args.run_dir)
    if args.command == "add":
        texts = read_reports(args.reports)
        if args.by == "doctor":
            problem = setup_problem(doctor_reports(texts), args.nodes or len(args.reports))
            if problem:
                print(problem)
                return EXIT_USAGE
            for line in known_issue_warnings(texts):
                print(line)
        named = collect(args.by, texts, args.job, args.restart)
        if args.by == "roll-call":
            up = up_by_launcher(args.run_dir, [e.node for e in named])
            for node in up:
                print("{} is up: its ddp-launch reported its workers' crash ({}): a crash, not a lost node".format(
                    node, LAUNCHER_CRASH_REPORT.format(node=node)))
            answered = [e.node for e in named if e.node in args.up and e.node not in up]
            for node in answered:
                print("{} is up: its slurmd answered after the step failed (its ranks were killed, or stopped, on a "
                      "live node): a crash, not a lost node".format(node))
            named = [e for e in named if e.node not in up and e.node not in answered]
        record, new = merge(known, named)
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
