"""Your own training script under ddp-launch: what it is told, and the few calls that let it take part.

    from ddp_contract import workload as ddp

What every workload gets, in its environment, from the job scripts, the pods and ddp-launch:
  DDP_RUN_DIR       the run's directory (its checkpoint goes there; the launcher's logs, the preflight's
                    reports and the fabric gate's are there too): run_dir()
  DDP_DATA_DIR      the data directory the job was given, where there is one: data_dir()
  DDP_STOP_REQUEST  the file whose appearance asks the run to stop (the job script writes it when SLURM
                    signals the time limit, `--signal=B:USR2@120`, to the batch shell alone); the text in
                    it names the signal. Unset where stops come only as signals (a pod).
  DDP_RESUME        "1" when this run continues an earlier one of the same run dir (a requeue, a spare that
                    replaced a lost node, RUNAI_RESUME): a checkpoint should be there; "0" otherwise.
                    torchrun's TORCHELASTIC_RESTART_COUNT > 0 (--max-restarts) says the same: resuming().
  RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: torch's env:// variables,
                    and SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS that agree with them (ddp_launch/worker_env.py).
And the exit codes the job scripts and pods act on: EXIT_REQUEUE (75) "checkpointed on a stop: requeue me",
EXIT_BAD_NODE (76) "this node is bad: requeue without it", 2 a usage error (never retried), 1 a crash.

Taking part, in a few lines (examples/argparse_torchrun.py does all of it):
    ddp.watch(model)                # after DDP(...): counts gradient buckets, so a hang names its rank
    for step in range(start, steps):
        ddp.progress(step)          # a heartbeat: the node's agent names a rank that stops advancing
        ...
        if ddp.stop_requested():    # USR1, USR2, TERM or the stop file, agreed by every rank
            save(checkpoint)        # to run_dir()
            sys.exit(ddp.EXIT_REQUEUE)
A collective that fails because a node went away, raised out of the script, is followed by the roll call
(ddp_contract.roll_call) once progress() has run: the lost node is named in one line and in
<run-dir>/roll-call.json, and the job script replaces it with a spare or requeues without it.

Standard library only at import (torch is imported by the calls that need it, in a process that has it);
stop_requested(), progress() and watch() call into torch.distributed when a process group of several
ranks is up, so call them at the same steps on every rank.
"""

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from ddp_contract import EXIT_BAD_NODE, EXIT_REQUEUE, EXIT_USAGE, STOP_REQUEST_FILE  # noqa: F401 (the contract)

RUN_DIR_VAR = "DDP_RUN_DIR"
DATA_DIR_VAR = "DDP_DATA_DIR"
STOP_REQUEST_VAR = "DDP_STOP_REQUEST"
RESUME_VAR = "DDP_RESUME"
TORCHRUN_RESTARTS_VAR = "TORCHELASTIC_RESTART_COUNT"
# The signals that ask for a stop, as the trainer takes them (src/ddp_train/safety/signals.py): SLURM's
# time-limit warning (--signal) and scancel --signal send USR1/USR2, scancel and preemption TERM, and
# Kubernetes TERM to a pod's containers; ddp-launch's agent passes each on to its workers.
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGUSR1, signal.SIGTERM)
# Rank 0 looks for the stop file at most this often (one stat on a shared file system), as the trainer does.
REQUEST_POLL_S = 5.0
# A rank is called hung after half the collective timeout without progress (the trainer's rule), where the
# timeout is this unless torch says its own (progress(timeout_s=...) gives yours).
DEFAULT_TIMEOUT_S = 600.0


def _path(name: str, env: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    value = (os.environ if env is None else env).get(name, "")
    return Path(value) if value else None


def run_dir(env: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """DDP_RUN_DIR: where the run's checkpoint goes (None when no job script or pod set it)."""
    return _path(RUN_DIR_VAR, env)


def data_dir(env: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """DDP_DATA_DIR: the data the job was given (None where there is none)."""
    return _path(DATA_DIR_VAR, env)


def resuming(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this run continues an earlier one (a requeue, a spare's replacement, RUNAI_RESUME, torchrun's
    restart): a checkpoint of yours should be in run_dir(). Resume from one you find in any case."""
    env = os.environ if env is None else env
    try:
        restarts = int(env.get(TORCHRUN_RESTARTS_VAR) or "0")
    except ValueError:
        restarts = 0
    return env.get(RESUME_VAR) == "1" or restarts > 0


def stop_signal_named(text: str) -> int:
    """The signal a stop request names ("USR2", "SIGUSR2"), SIGUSR2 for one it does not know."""
    name = text.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    known = {signal.Signals(sig).name: int(sig) for sig in STOP_SIGNALS}
    return known.get(name, int(signal.SIGUSR2))


class _Stop:
    """The first stop this process was asked for: a signal, or (rank 0) the stop request file."""

    def __init__(self, request: Optional[Path], poll_s: float = REQUEST_POLL_S):
        self.signum = 0
        self.request = request
        self.poll_s = poll_s
        self._polled_at = -float("inf")

    def install(self) -> "_Stop":
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def local(self, now: float) -> int:
        if not self.signum and self.request is not None and now - self._polled_at >= self.poll_s:
            self._polled_at = now
            try:
                self.signum = stop_signal_named(self.request.read_text())
            except OSError:
                pass  # no request (or none readable): a stop is never made up
        return self.signum


_stop = None  # type: Optional[_Stop]


def _rank(env: Mapping[str, str], name: str = "RANK") -> int:
    try:
        return int(env.get(name) or "0")
    except ValueError:
        return 0


def _several_ranks() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _max_over_ranks(value: int) -> int:
    """The largest value of every rank's, on every rank: one 4-byte all-reduce, on the GPU under NCCL."""
    import torch
    import torch.distributed as dist
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.tensor([value], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def stop_requested(agree: bool = True) -> Optional[str]:
    """The stop signal's name ("SIGUSR2") once a stop was asked for, else None. The first call installs the
    handlers for USR1, USR2 and TERM (from then on they set the request instead of ending the process), as the
    trainer's. agree: every rank's answer is the same (one small all-reduce, a collective: call it at the
    same step on every rank); False reads this process's own alone."""
    global _stop
    if _stop is None:
        env = os.environ
        request = _path(STOP_REQUEST_VAR, env) if _rank(env) == 0 else None
        _stop = _Stop(request).install()
    signum = _stop.local(time.monotonic())
    if agree and _several_ranks():
        signum = _max_over_ranks(signum)
    if not signum:
        return None
    if _stop.request is not None:
        try:  # acted on: a run started again by hand must not stop at once
            _stop.request.unlink()
        except OSError:
            pass
    return signal.Signals(signum).name


# -- progress: the heartbeat, the hang forensics and the roll call -------------------------------------------

class _Taking:
    forensics = None  # type: Any
    hosts = None      # type: Optional[list]


_taking = _Taking()


def _timeout_s(given: Optional[float]) -> float:
    if given:
        return float(given)
    try:
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_timeout
        return _get_default_timeout(dist.get_backend()).total_seconds()
    except Exception:  # an older torch, no process group: the trainer's own default
        return DEFAULT_TIMEOUT_S


def _start(timeout_s: Optional[float]) -> None:
    from ddp_contract import roll_call
    from ddp_contract.worker_heartbeat import Forensics, wanted
    env = os.environ
    where = str(run_dir(env) or os.getcwd())
    forensics = Forensics.start(env, _rank(env), _rank(env, "LOCAL_RANK"), where, _timeout_s(timeout_s)) \
        if wanted(env) else Forensics.off()
    hosts = None
    if _several_ranks():
        import torch.distributed as dist
        hosts = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, roll_call.node_name(env))
    _taking.forensics, _taking.hosts = forensics, hosts


def progress(step: int, timeout_s: Optional[float] = None) -> None:
    """A training step begins: the heartbeat ddp-launch's agent reads (a few memory writes). The first call
    starts this rank's hang forensics (its stacks and Flight Recorder dump on a hang, into the run dir) and,
    in a process group of several ranks, gathers every rank's node for the roll call (a collective: call it
    at the same step on every rank, after init_process_group). timeout_s: your process group's timeout, when
    you gave init_process_group one (a rank is hung after half of it)."""
    if _taking.forensics is None:
        _start(timeout_s)
    _taking.forensics.heartbeat.step(step)


def watch(model: Any) -> Any:
    """Have a DistributedDataParallel model count its gradient buckets into the heartbeat: a rank that hangs
    in its computation while the others wait in the all-reduce is then named as the one they wait for. It
    registers DDP's all-reduce as a comm hook (DistributedDataParallel.register_comm_hook, one per model):
    leave it out where your model has its own hook. Returns the model."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def counted(state, bucket):  # unannotated: DDP checks a hook's annotations (GradBucket, Future)
        if _taking.forensics is not None:
            _taking.forensics.heartbeat.bucket()
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, counted)
    return model


def after_failure(error: BaseException) -> Optional[bool]:
    """The roll call after an error raised out of the workload (ddp_launch.worker calls it, then exits 1, a
    crash, which the job script turns into a spare or a requeue without the node): when a node went away,
    its one line from one rank and <run-dir>/roll-call.json for the job script; whether this rank said it.
    None when this was no lost node (the error keeps its traceback) or the workload never called progress()."""
    if _taking.hosts is None:
        return None
    from ddp_contract import roll_call
    env = os.environ
    where = run_dir(env)
    verdict = roll_call.roll_call(_taking.hosts, _rank(env), error, "in {}".format(where or "the run dir"),
                                  env.get("MASTER_ADDR", "?"), wait_s=roll_call.ROLL_CALL_S,
                                  run_dir=None if where is None else str(where), env=env)
    if verdict is None:
        return None
    if verdict.prints:
        if verdict.report and where is not None:
            roll_call.write_report(str(where), verdict.report, program="ddp-launch")
        print("ddp-launch: error: {}".format(verdict.message), file=sys.stderr, flush=True)
    return verdict.prints


def finish() -> None:
    """Stop the forensics' thread (ddp_launch.worker calls it when the workload ends)."""
    if _taking.forensics is not None:
        _taking.forensics.stop()
