"""This worker's heartbeat for its node's agent, and what it leaves behind when the agent finds a hang.

The trainer's (ddp_train.safety.heartbeat), and a user's script's through ddp_contract.workload: no torch
here but in dump_flight_recorder, which runs in a process that has it.

The heartbeat (ddp_contract.heartbeat) costs a few memory stores per step: the agent's
watchdog (ddp_launch.watchdog) reads it. For forensics, faulthandler writes every Python
thread's stack on STACKS_SIGNAL, even while the main thread is blocked in a collective
(it needs no GIL), and a daemon thread answers the agent's dump request with this rank's
Flight Recorder buffer: gloo records into it but only NCCL dumps it on a timeout itself
(torch 2.14: ProcessGroupNCCL's watchdog; checked in tests/unit/train/test_heartbeat.py).
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import os
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import IO, Mapping, Optional

from ddp_contract import heartbeat as hb

# Ignored by default (signal(7)), so a stray one harms no process; nothing in a trainer uses
# out-of-band socket data. USR1/USR2/TERM already mean "checkpoint and stop".
STACKS_SIGNAL = signal.SIGURG
FR_DUMP_VARS = hb.FR_DUMP_VARS


def warn(line: str) -> None:
    """One line on stderr; a full disk under the log loses it, never with a traceback."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:
        pass
REQUEST_POLL_S = 0.5
# "0" turns off the heartbeat, the step clock and its comm hook (benchmarks/trainer_throughput.py
# compares the two); the Flight Recorder stays as the launcher set it.
FORENSICS_VAR = "DDP_FORENSICS"


def wanted(env: Mapping[str, str]) -> bool:
    return env.get(FORENSICS_VAR, "1") != "0"
_STEP = struct.Struct("<qqd")
_BUCKET = struct.Struct("<qd")


class Heartbeat:
    """The record, written in place; a disabled one (no agent) does nothing, at no cost."""

    def __init__(self, record: Optional[mmap.mmap] = None):
        self._record = record
        self._buckets = 0

    @property
    def enabled(self) -> bool:
        return self._record is not None

    def step(self, step: int) -> None:
        """A training step begins (forward and backward next)."""
        if self._record is not None:
            self._buckets = 0
            self._write(hb.STEP_OFFSET, _STEP.pack(step, 0, time.monotonic()))
            self._record[hb.PHASE_OFFSET] = hb.STEP

    def bucket(self) -> None:
        """A gradient bucket was handed to the all-reduce (from DDP's comm hook)."""
        if self._record is not None:
            self._buckets += 1
            self._write(hb.BUCKET_OFFSET, _BUCKET.pack(self._buckets, time.monotonic()))
            self._record[hb.PHASE_OFFSET] = hb.ALLREDUCE

    def _write(self, offset: int, packed: bytes) -> None:
        # Packed first, then copied in one slice: struct.pack_into zeroes its whole span before it
        # packs the fields (CPython's s_pack_internal), and the agent's watchdog, reading the record
        # in that moment, saw a time of 0: a rank idle since boot, which it named as hung and killed.
        self._record[offset:offset + len(packed)] = packed

    def phase(self, phase: int) -> None:
        if self._record is not None:
            self._write(hb.BUCKET_OFFSET + 8, struct.pack("<d", time.monotonic()))
            self._record[hb.PHASE_OFFSET] = phase


def stall_after_s(dist_timeout_s: float) -> float:
    """How long a rank may stop advancing before its agent calls it hung: half the collective
    timeout, so the stacks are taken and the job ended before that timeout fires."""
    return dist_timeout_s / 2


def use_run_dir_for_flight_recorder(run_dir: str, env: Mapping[str, str], environ: dict) -> Optional[str]:
    """Point the Flight Recorder's dump at <run_dir>/forensics, unless the user chose a place.

    The launcher cannot: only the trainer knows the run directory. torch reads the variable
    from the process environment when the process group starts, so it is written there.
    https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html
    """
    if any(env.get(name) for name in FR_DUMP_VARS):
        return None
    prefix = hb.flight_recorder_prefix(run_dir)
    environ[FR_DUMP_VARS[0]] = prefix
    return prefix


class Forensics:
    """The heartbeat record, the stack handler and the dump-request thread of one worker."""

    def __init__(self, heartbeat: Heartbeat, stacks: Optional[IO[str]] = None):
        self.heartbeat = heartbeat
        self._stacks = stacks
        self._stop = threading.Event()

    @classmethod
    def off(cls) -> "Forensics":
        return cls(Heartbeat())

    @classmethod
    def for_run(cls, env: Mapping[str, str], rank: int, local_rank: int, run_dir: str, dist_timeout_s: float,
                environ: dict) -> "Forensics":
        """Started where the launcher asked (wanted), off elsewhere; and the Flight Recorder's dump
        pointed at the run dir (in `environ`, before the process group starts: torch reads it then)."""
        forensics = cls.start(env, rank, local_rank, run_dir, dist_timeout_s) if wanted(env) else cls.off()
        use_run_dir_for_flight_recorder(run_dir, env, environ)
        return forensics

    @classmethod
    def start(cls, env: Mapping[str, str], rank: int, local_rank: int, run_dir: str,
              dist_timeout_s: float) -> "Forensics":
        directory = env.get(hb.HEARTBEAT_DIR_VAR)
        if not directory or not os.path.isdir(directory):
            return cls(Heartbeat())
        path = hb.record_path(directory, rank)
        with open(path, "wb") as f:
            f.write(bytes(hb.RECORD_SIZE))
        fd = os.open(path, os.O_RDWR)
        try:
            record = mmap.mmap(fd, hb.RECORD_SIZE)
        finally:
            os.close(fd)
        hb.PROGRESS.pack_into(record, hb.PROGRESS_OFFSET, os.getpid(), -1, 0, time.monotonic())
        hb.HEADER.pack_into(record, 0, hb.MAGIC, hb.SETUP, 0, 0)
        stacks = open(hb.stacks_path(directory, rank), "w")
        faulthandler.register(STACKS_SIGNAL, file=stacks, all_threads=True, chain=False)
        hb.write_info(directory, rank, {
            "rank": rank, "local_rank": local_rank, "pid": os.getpid(), "node": socket.gethostname(),
            "run_dir": str(Path(run_dir).resolve()), "stall_after_s": stall_after_s(dist_timeout_s),
            "main_thread": threading.main_thread().ident})
        forensics = cls(Heartbeat(record), stacks)
        threading.Thread(target=forensics._answer_dump_requests, args=(record, rank, run_dir),
                         name="ddp-forensics", daemon=True).start()
        return forensics

    def _answer_dump_requests(self, record: mmap.mmap, rank: int, run_dir: str) -> None:
        while not self._stop.wait(REQUEST_POLL_S):
            asked = record[hb.REQUEST_OFFSET]
            if asked != record[hb.DONE_OFFSET]:
                dump_flight_recorder(run_dir, rank)
                record[hb.DONE_OFFSET] = asked

    def stop(self) -> None:
        self._stop.set()
        if self._stacks is not None:
            faulthandler.unregister(STACKS_SIGNAL)
            self._stacks.close()


def dump_flight_recorder(run_dir: str, rank: int) -> Optional[Path]:
    """This rank's Flight Recorder buffer (torch's pickle, as its own dump writes) in the run dir."""
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import _dump_fr_trace
        if not dist.is_initialized():
            return None
        data = _dump_fr_trace()
    except Exception:  # an older torch, or a dump it cannot make: the stacks still tell
        return None
    out = Path(hb.flight_recorder_prefix(run_dir) + str(rank))
    tmp = out.with_suffix(".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, out)
    except OSError as exc:  # a full disk: the stacks and the other ranks' dumps still tell
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        warn(f"ddp-train: warning: rank {rank}: cannot write its Flight Recorder dump {out} "
             f"({exc.strerror or exc}); free space in {out.parent} for the next one")
        return None
    return out

