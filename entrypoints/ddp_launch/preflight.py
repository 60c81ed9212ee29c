"""`ddp-launch preflight`: in a RunAI/Kubeflow pod, the checks a SLURM job runs before it trains, then the training.

    ddp-launch preflight [--site S] [--data-dir D] --run-dir R -- LAUNCH FLAGS -- WORKLOAD ARGUMENTS

runai/pod.sh runs it in every pod. It does what slurm/lib/ddp.sh does around its training step,
with the same verdicts, from the same code, and then execs `ddp-launch LAUNCH FLAGS -- TRAINER FLAGS`:
1. the run dir is not another job's (ddp_contract.rundir_lock, with the job's identity that
   ddp-launch gives the trainer: a restarted container of this job finds its own lock);
2. `ddp-launch doctor --json` in every pod (DDP_PREFLIGHT=0 skips it), each report written to the
   shared run dir (preflight/<job>/doctor-<pod>.json), and one verdict from all of them, the same
   in every pod (ddp_contract.quarantine reads the reports): a check that fails in every pod is the
   setup's (one line, exit 2); a pod that fails alone is named;
3. the fabric gate (python -m ddp_train.gate) through ddp-launch across the pods, like the training
   (DDP_FABRIC_GATE=0 skips it): a pod it names is named the same way.
The launch flags name the workload (--script PATH, --module MOD; the built-in trainer where neither is
given): the doctor checks what it needs (the script visible in the pod, or CIFAR-100 for the trainer), and
the gate runs our own module whatever it is.
What a named pod and the others do: a pod cannot requeue itself without its node, as a SLURM job
does (its scheduler placed it; only the cluster's admins can cordon the node). So every pod stops
with 76 (ddp_contract.EXIT_BAD_NODE), not only the named one: the others would wait in the
rendezvous for a pod that may never pass. The operator's restart policy then acts on the whole job
(Kubeflow's replica restartPolicy: OnFailure restarts each container in its pod, where this
preflight runs again; ExitCode retries only an exit code >= 128, kubeflow/training-operator
pkg/util/train/train_util.go IsRetryableExitCode, so 76 ends the job there, as Never does).
Elastic jobs (PET_NNODES=MIN:MAX) run no fixed number of pods: each pod's report is judged alone.

Only this attempt's reports are judged: the claim keeps every report an earlier container left
(a pod deletes only its own before its doctor runs), and a pod restarted after a failure may read
another pod's old failing report before that pod has replaced it (fresh_since below).
A late pod of an elastic job (one scaled up, or restarted, once the others train) runs no gate:
the gate measures all pods at once, and the others left its rendezvous for the training's
(late_joiner below).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ddp_contract import EXIT_BAD_NODE, EXIT_REQUEUE, EXIT_USAGE, HARDWARE_CHECKS, JOB_ID_VAR, rundir_lock
from ddp_contract.quarantine import Failed, doctor_failures, known_issue_warnings, named_by_gate
from ddp_launch import planner
from ddp_launch.errors import LaunchError
from ddp_launch.fabric.defaults import read_fabric_data
from ddp_launch.flags import FlagParser
from ddp_launch.torchrun_command import TORCHRUN_JOIN_TIMEOUT_S
from ddp_launch.launch_options import Workload
from ddp_launch.options import read_options, split_workload
from ddp_launch.plan import LaunchPlan

DOCTOR_PREFIX = "doctor-"  # as the SLURM preflight names its reports (ddp_contract.quarantine)
POLL_S = 1.0
# The pods' reports are compared by their mtimes, all set by the claim's file system, as the run-dir
# lock compares its heartbeat (ddp_contract.rundir_lock): no clock of one pod's node against another's.
# Some file systems take a file's mtime from the writing client's clock (a CephFS or Lustre client),
# so two nodes' NTP-kept clocks may still differ by a little: this much is allowed for.
CLOCK_SKEW_S = 30.0
# How long a late elastic pod waits on one connect to the rendezvous host's ports.
CONNECT_TIMEOUT_S = 3.0
# The launcher flags the gate's launch sets itself (its logs, its port, its workload).
GATE_OWN_FLAGS = ("--log-dir", "--rdzv-port", "--module", "--script")
RESTART_POLICY = ("every pod of the job stops (exit 76): a pod cannot leave its node as a SLURM job requeues "
                  "without one, so the job's restart policy decides (OnFailure restarts each container in its pod, "
                  "where this preflight runs again; ExitCode, which retries only codes >= 128, and Never end "
                  "the job); if the pod's node stays bad, ask the cluster's admins to cordon it (kubectl get pod "
                  "POD -o wide names it) and submit again")


@dataclass(frozen=True)
class Verdict:
    code: int                   # 0 go on, EXIT_USAGE a setup problem, EXIT_BAD_NODE a pod named
    lines: tuple[str, ...]      # what every pod prints, the same in each


def parse_args(argv: Sequence[str], env: Mapping[str, str]):
    """(this command's flags, the launch's words after the first `--`)."""
    own, launch = split_workload(argv)
    parser = FlagParser(prog="ddp-launch preflight", subcommand="preflight", description=__doc__.splitlines()[0],
                        hint="give the launch's flags after --")
    parser.add_argument("--site", default=env.get("DDP_LAUNCH_SITE"), help="site profile (default: $DDP_LAUNCH_SITE)")
    parser.add_argument("--data-dir", help="where CIFAR-100 is (the built-in trainer's), for doctor")
    parser.add_argument("--run-dir", required=True, help="the run dir on the shared claim: reports, gate.json")
    return parser.parse_args(own), tuple(launch)


def trainer_backend(words: Sequence[str]) -> str:
    """The trainer's --backend, which the gate uses too (auto when not given), as slurm/lib/ddp.sh reads it."""
    backend = "auto"
    for previous, word in zip(("", *words), words):
        if previous == "--backend":
            backend = word
        elif word.startswith("--backend="):
            backend = word[len("--backend="):]
    return backend


def gate_port(training_port: int) -> int:
    """A port of its own for the gate's rendezvous, next to the training's: the pods leave the gate
    at different instants, and one that starts the training while the master's gate store is still
    up would join the closed rendezvous there (the SLURM path gives each step its own port too)."""
    return training_port + 1 if training_port < 65535 else training_port - 1


def gate_launch_argv(launch_flags: Sequence[str], run_dir: str, port: int, site: str | None,
                     backend: str) -> list[str]:
    """The training's launcher flags with the gate's own log dir, port and workload."""
    kept, skip = [], False
    for word in launch_flags:
        if skip:
            skip = False
        elif word in GATE_OWN_FLAGS:
            skip = True
        elif not word.startswith(tuple(f"{flag}=" for flag in GATE_OWN_FLAGS)):
            kept.append(word)
    return [*kept, "--log-dir", os.path.join(run_dir, "logs", "gate"), "--rdzv-port", str(port),
            "--module", "ddp_train.gate", "--", "--run-dir", run_dir, "--backend", backend,
            *(("--site", site) if site else ())]


def file_key(text: str) -> str:
    """A job or pod name as a file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text) or "_"


def failing_everywhere(reports: Mapping[str, tuple[Failed, ...]], pods: int) -> Failed | None:
    """The check that fails in the report of every pod, by quarantine.setup_problem's rule: the only
    pod of a job counts as every pod (one pod cannot tell its node's fault from the setup's), except
    for a check of its own hardware (HARDWARE_CHECKS)."""
    judged = sorted(reports.items())
    if not judged or len(judged) < pods:
        return None
    names = [{failure.name for failure in failures} for _, failures in judged[1:]]
    return next((failure for failure in judged[0][1] if all(failure.name in found for found in names)
                 and (len(judged) > 1 or failure.name not in HARDWARE_CHECKS)), None)


def doctor_verdict(reports: Mapping[str, tuple[Failed, ...] | None], pods: int,
                   earlier: Sequence[str] = ()) -> Verdict:
    """One verdict from every pod's doctor report of this attempt (None: a file that is no report);
    earlier: the pods whose only report is an earlier attempt's (fresh_since), not judged."""
    lines = [f"preflight: the doctor report of pod {pod} is an earlier attempt's (written longer before this pod's "
             f"than the pods wait for each other), and none of this attempt's came in time: not judged"
             for pod in sorted(earlier)]
    lines += [f"preflight: no doctor report from pod {pod} (see its log): not judged"
              for pod, failures in sorted(reports.items()) if failures is None]
    judged = {pod: failures for pod, failures in reports.items() if failures is not None}
    if len(reports) < pods:
        lines.append(f"preflight: {len(reports)} of {pods} pods reported in time: the others are not judged "
                     f"(the rendezvous waits for them)")
    common = failing_everywhere(judged, pods) if len(judged) >= pods else None
    if common is not None:
        where = (f"in every pod of the job ({len(judged)} of {len(judged)})" if len(judged) > 1
                 else f"in the job's only pod ({next(iter(judged))})")
        return Verdict(EXIT_USAGE, (*lines, f"preflight: ddp-launch doctor fails '{common.name}' {where}: "
                                            f"{common.detail}: a setup problem, not a bad pod, so no pod is named; "
                                            f"fix: {common.fix or 'see each pod doctor-<pod>.json'}"))
    bad = [f"preflight: bad pod {pod}: ddp-launch doctor fails "
           + "; ".join(f"'{f.name}': {f.detail}" + (f" (fix: {f.fix})" if f.fix else "") for f in failures)
           for pod, failures in sorted(judged.items()) if failures]
    if bad:
        return Verdict(EXIT_BAD_NODE, (*lines, *bad, f"preflight: {RESTART_POLICY}"))
    return Verdict(0, (*lines, f"preflight: ddp-launch doctor passed in every pod ({len(judged)})"))


def gate_verdict(code: int, report: object, run_dir: str) -> Verdict:
    """The fabric gate's exit and report (gate.json) as the pods' verdict."""
    if code == 0:
        return Verdict(0, ("preflight: the fabric gate passed",))
    named = named_by_gate(report) if code == EXIT_BAD_NODE else {}
    if named:
        return Verdict(EXIT_BAD_NODE, (*(f"preflight: bad pod {pod}: the fabric gate measured {why}"
                                         for pod, why in sorted(named.items())), f"preflight: {RESTART_POLICY}"))
    if code in (EXIT_USAGE, EXIT_REQUEUE):
        return Verdict(code, ())  # the gate said why (a flag, a site), or a stop signal came
    return Verdict(code or 1, (f"preflight: the fabric gate failed (exit {code}) without naming a pod: see "
                               f"{os.path.join(run_dir, 'gate.txt')} and {os.path.join(run_dir, 'logs', 'gate')}",))


@dataclass(frozen=True)
class Reports:
    """The reports on the claim: this attempt's ({pod: text}) and the pods whose report is older."""

    fresh: dict[str, str]
    earlier: tuple[str, ...] = ()


def fresh_since(own_mtime: float, join_timeout_s: float) -> float:
    """The oldest mtime a report of this attempt can have, given this pod's own report's.

    The pods of one attempt wait for each other's reports as long as their rendezvous waits for
    them (wait_for_reports, with the launch's join timeout): a pod that wrote its report longer ago
    than that before this one stopped waiting, and is gone, or in the gate or the training without
    this pod. Its report is an earlier container's, whatever it says: a restarted pod must not be
    named bad, or named good, by the report that a pod wrote an attempt ago (an hour-old failure
    would stop every pod again with 76, using up the job's restarts).
    """
    return own_mtime - join_timeout_s - CLOCK_SKEW_S


def read_reports(directory: Path, since: float | None = None) -> Reports:
    """The reports written so far, split by their mtime at since (None: every report is fresh)."""
    fresh, earlier = {}, []
    for path in directory.glob(f"{DOCTOR_PREFIX}*.json"):
        pod = path.name[len(DOCTOR_PREFIX):-len(".json")]
        try:
            if since is not None and path.stat().st_mtime < since:
                earlier.append(pod)
                continue
            fresh[pod] = path.read_text(errors="replace")
        except OSError:
            continue
    return Reports(fresh, tuple(sorted(earlier)))


def wait_for_reports(directory: Path, pods: int, timeout_s: float, since: float | None = None,
                     clock: Callable[[], float] | None = None,
                     sleep: Callable[[float], None] | None = None) -> Reports:
    """Every pod's report of this attempt (written at or after since), or those written within timeout_s."""
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    deadline = clock() + timeout_s
    while True:
        found = read_reports(directory, since)
        if len(found.fresh) >= pods or clock() >= deadline:
            return found
        sleep(POLL_S)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    os.replace(staging, path)


class Children:
    """The one child running now (doctor, the gate), stopped with this process on a stop signal:
    in a pod this process is PID 1, which gets no default action for TERM (pid_namespaces(7))."""

    def __init__(self):
        self.current: subprocess.Popen | None = None

    def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
        with subprocess.Popen(list(argv), **kwargs) as child:
            self.current = child
            out, _ = child.communicate()
            self.current = None
            return subprocess.CompletedProcess(child.args, child.returncode, out)

    def stop_on_signals(self) -> None:
        def leave(signum, frame):
            if self.current is not None:
                self.current.send_signal(signum)
            os._exit(EXIT_REQUEUE)
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
            signal.signal(signum, leave)


def say(lines: Sequence[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class PodLaunch:
    """The training's launch as this pod reads it: its flags and the trainer's, its plan, the job and the pod."""

    flags: tuple[str, ...]          # ddp-launch's flags for the training
    trainer: tuple[str, ...]        # the workload's arguments
    plan: LaunchPlan | None         # None: the launcher refuses (doctor says why in its "launch plan" check)
    plan_problem: str
    join_timeout_s: float           # how long the pods wait for each other, as the rendezvous would
    job: str                        # the job's identity (DDP_JOB_ID), "" where nothing names it
    pod: str                        # this pod's name
    workload: Workload = Workload()  # what the training runs: the built-in trainer, a script, a module

    @property
    def pods(self) -> int:
        """The pods whose reports make the verdict: every pod of the job, or this one for an elastic job."""
        return self.plan.nodes if self.plan is not None and self.plan.min_nodes is None else 1


def read_launch(launch_words: Sequence[str], env: Mapping[str, str],
                probe: Callable[[planner.ProbeQuestions], planner.NodeFacts]) -> PodLaunch:
    flags, trainer = split_workload(launch_words)
    options = read_options(list(launch_words), env)
    launch = planner.parse(options, env, read_fabric_data(options.site, env))
    if "kubeflow" not in launch.scheduler.MODES:
        raise LaunchError(f"ddp-launch preflight runs in a RunAI/Kubeflow pod (runai/pod.sh); this launch is "
                          f"{', '.join(launch.scheduler.MODES)}: a SLURM job script runs its own (slurm/lib/ddp.sh)")
    # The launcher's own probe (it waits for the master's DNS name); the GPUs are doctor's to judge.
    facts = probe(replace(planner.questions(launch), cuda=False))
    plan, plan_problem = None, ""
    try:
        plan = planner.plan(launch, facts)
    except LaunchError as refused:
        plan_problem = str(refused)
    identity = launch.scheduler.identity(launch.job, facts)
    return PodLaunch(tuple(flags), trainer, plan, plan_problem,
                     float(options.rdzv_timeout.value) if options.rdzv_timeout else TORCHRUN_JOIN_TIMEOUT_S,
                     env.get(JOB_ID_VAR) or identity.job_id or "",
                     identity.node_name or socket.gethostname().split(".")[0], options.workload)


def doctor_argv(pod: PodLaunch, data_dir: str | None, site: str | None) -> list[str]:
    """The doctor's command: the site, the data dir where there is one, and the workload it checks."""
    workload = () if pod.workload.is_ours else tuple(pod.workload.describe().split(" ", 1))
    return [sys.executable, "-m", "ddp_launch", "doctor", "--json", *(("--data-dir", data_dir) if data_dir else ()),
            *(("--site", site) if site else ()), *workload]


def doctor_everywhere(pod: PodLaunch, run_dir: str, data_dir: str | None, site: str | None,
                      children: Children) -> Verdict:
    """doctor here, its report beside the other pods' on the claim, and the verdict from all of them."""
    directory = Path(run_dir) / "preflight" / file_key(pod.job or pod.pod)
    report = directory / f"{DOCTOR_PREFIX}{file_key(pod.pod)}.json"
    report.unlink(missing_ok=True)
    done = children.run(doctor_argv(pod, data_dir, site), stdout=subprocess.PIPE, text=True)
    write_atomically(report, done.stdout)
    if pod.pods > 1:
        since = fresh_since(report.stat().st_mtime, pod.join_timeout_s)
        found = wait_for_reports(directory, pod.pods, pod.join_timeout_s, since)
    else:
        found = Reports({pod.pod: done.stdout})
    verdict = doctor_verdict({name: doctor_failures(text) for name, text in found.fresh.items()}, pod.pods,
                             found.earlier)
    # A known slowdown of a pod's stack trains, said here as the SLURM preflight says it (quarantine add).
    warned = known_issue_warnings(found.fresh, what="pod")
    return replace(verdict, lines=(*warned, *verdict.lines, f"preflight: the reports are in {directory}"))


def gate_across_pods(pod: PodLaunch, run_dir: str, site: str | None, children: Children) -> Verdict:
    """The fabric gate through ddp-launch, like the training, and the pod it names."""
    gate_json = Path(run_dir) / "gate.json"
    # Every pod removes an earlier run's before it joins the gate's rendezvous, so before rank 0 writes it.
    gate_json.unlink(missing_ok=True)
    argv = gate_launch_argv(pod.flags, run_dir, gate_port(pod.plan.rendezvous.port), site,
                            trainer_backend(pod.trainer) if pod.workload.is_ours else "auto")
    code = children.run([sys.executable, "-m", "ddp_launch", *argv]).returncode
    try:
        report = json.loads(gate_json.read_text())
    except (OSError, ValueError):
        report = None
    return gate_verdict(code, report, run_dir)


def port_answers(address: str, port: int) -> bool:
    """Whether something accepts a TCP connection at address:port (the c10d store of a rendezvous)."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def late_joiner(pod: PodLaunch, connect: Callable[[str, int], bool],
                clock: Callable[[], float] | None = None,
                sleep: Callable[[float], None] | None = None) -> Verdict | None:
    """Why this pod of an elastic job runs no fabric gate (the others train), or None: it joins the gate.

    The rendezvous host's pod hosts two c10d stores in turn, the gate's (gate_port) and then the
    training's: the first to answer tells where the job is. The gate's: its rendezvous is open or
    running, and torchrun's elastic rendezvous admits a pod that comes now (the running round
    restarts with it). The training's: the gate ended, and its rendezvous will never be hosted
    again; a gate of its own would wait for pods that train. Neither yet (the host is in doctor,
    or between the two): ask again, as long as the gate's rendezvous would wait.
    A late pod is then checked by doctor, alone as every elastic pod is, and its network by the
    training itself: after the first collective the trainer checks the transport NCCL chose against
    the fabric the launcher expects (DDP_EXPECT_FABRIC), and torchrun's rendezvous admits the pod
    at its next round. Where the gate would run with no one else, nothing is lost: a gate of one
    pod measures no link. A static job has no late pod: its rendezvous waits for every pod.
    """
    plan = pod.plan
    if plan is None or plan.min_nodes is None or plan.rendezvous is None or plan.rendezvous.port is None:
        return None
    if plan.rendezvous.here is not False:
        return None  # the host's pod hosts the gate's rendezvous itself, or torchrun alone can tell
    address = plan.rendezvous.address or plan.rendezvous.host
    training, gate = plan.rendezvous.port, gate_port(plan.rendezvous.port)
    clock, sleep = clock or time.monotonic, sleep or time.sleep
    deadline = clock() + pod.join_timeout_s
    asked = 0
    while clock() < deadline:
        if connect(address, gate):
            return None
        if connect(address, training):
            return Verdict(0, (f"preflight: pod {pod.pod} joins the elastic job {pod.job or '(unnamed)'} late: its pods "
                               f"already train (the training's rendezvous at {address}:{training} answers, the fabric "
                               f"gate's at port {gate} is gone), so this pod runs no gate, which measures every pod "
                               f"at once; doctor checked it, and the trainer checks its network after the first "
                               f"collective (NCCL's transport against DDP_EXPECT_FABRIC)",))
        if not asked:
            say((f"preflight: waiting for the rendezvous host {address} to open the fabric gate's rendezvous "
                 f"(port {gate}) or the training's (port {training}), at most {pod.join_timeout_s:.0f} s",))
        asked += 1
        sleep(POLL_S)
    return None


def timed(what: str, step: Callable[[], Verdict]) -> int:
    """The step's verdict said, with its time, and its exit code."""
    started = time.monotonic()
    verdict = step()
    say((*verdict.lines, f"preflight: {what}: {time.monotonic() - started:.0f} s"))
    return verdict.code


def run(argv: Sequence[str], env: Mapping[str, str], children: Children,
        probe: Callable[[planner.ProbeQuestions], planner.NodeFacts] = planner.probe,
        connect: Callable[[str, int], bool] = port_answers) -> int:
    args, launch_words = parse_args(argv, env)
    pod = read_launch(launch_words, env, probe)
    try:
        rundir_lock.check(args.run_dir, rundir_lock.owner_here({JOB_ID_VAR: pod.job}))
    except rundir_lock.LockHeld as held:
        raise LaunchError(str(held)) from None
    children.stop_on_signals()
    say((f"preflight: pod {pod.pod} of job {pod.job or '(unnamed)'}: ddp-launch doctor in every pod, then the fabric "
         f"gate across them (DDP_PREFLIGHT=0, DDP_FABRIC_GATE=0 skip them)",))
    if env.get("DDP_PREFLIGHT", "1") != "0":
        code = timed("doctor and its verdict", lambda: doctor_everywhere(pod, args.run_dir, args.data_dir, args.site,
                                                                         children))
        if code != 0:
            return code
    if pod.plan is None:
        raise LaunchError(pod.plan_problem)
    late = late_joiner(pod, connect) if env.get("DDP_FABRIC_GATE", "1") != "0" else None
    if late is not None:
        say(late.lines)
    elif env.get("DDP_FABRIC_GATE", "1") != "0":
        code = timed("fabric gate (launch included)", lambda: gate_across_pods(pod, args.run_dir, args.site, children))
        if code != 0:
            return code
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "ddp_launch", *launch_words])
    return 127  # execv returns only by raising


def main(argv: Sequence[str]) -> int:
    return run(argv, os.environ, Children())
