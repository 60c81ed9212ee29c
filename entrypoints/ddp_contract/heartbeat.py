"""The heartbeat each worker keeps and its node's agent reads: one fixed record per rank.

A 64-byte file per rank under DDP_HEARTBEAT_DIR (node-local, made by the agent), mmap'ed
by both sides: the worker stores its step, phase and gradient buckets launched with a few
memory writes per step (no system call, no fsync); the agent reads it once a second and,
to ask for a Flight Recorder dump, bumps the request byte. Beside it, rank-<R>.json says
once who the rank is (pid, node, run dir, stall threshold). Works for any backend.
"""

import json
import os
import struct

HEARTBEAT_DIR_VAR = "DDP_HEARTBEAT_DIR"
# Where the Flight Recorder dumps: torch 2.14 reads TORCH_FR_DUMP_TEMP_FILE, then the older NCCL name (with a
# deprecation warning); a rank's dump is the prefix followed by its rank.
FR_DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
RECORD_SIZE = 64
MAGIC = b"DDPH"
# magic, phase, dump requests (agent), dumps done (worker), pad | pid, step, buckets, time
HEADER = struct.Struct("<4sBBBx")          # offset 0
PROGRESS = struct.Struct("<qqqd")           # offset 8: pid, step, buckets, monotonic time
PHASE_OFFSET, REQUEST_OFFSET, DONE_OFFSET = 4, 5, 6
PROGRESS_OFFSET = 8
STEP_OFFSET = 16                            # step, buckets, time: rewritten every step
BUCKET_OFFSET = 24                          # buckets, time: rewritten per gradient bucket

# Phases, in the order a training step goes through them (see train.py).
SETUP, WARMUP, STEP, ALLREDUCE, OPTIMIZER, EVAL, CHECKPOINT, DONE = range(8)
PHASE_NAMES = ("setup", "warm-up", "forward/backward", "gradient all-reduce", "optimizer step",
               "evaluation", "checkpoint", "done")
# Phases in which a rank must keep advancing (its peers wait for it in a collective), in the
# order a step goes through them: with the step and the buckets, how far a rank got.
WATCHED_PHASES = (STEP, ALLREDUCE, OPTIMIZER, EVAL, CHECKPOINT)


def record_path(directory, rank):
    return os.path.join(directory, "rank-{}.hb".format(rank))


def info_path(directory, rank):
    return os.path.join(directory, "rank-{}.json".format(rank))


def stacks_path(directory, rank):
    """Where faulthandler writes this rank's Python stacks (node-local; the agent copies them)."""
    return os.path.join(directory, "rank-{}.stacks".format(rank))


def forensics_dir(run_dir):
    """Stacks and Flight Recorder dumps of a hang go here, in the run directory (not /tmp)."""
    return os.path.join(run_dir, "forensics")


def flight_recorder_prefix(run_dir):
    """TORCH_FR_DUMP_TEMP_FILE: torch appends the rank to this prefix."""
    return os.path.join(forensics_dir(run_dir), "fr-trace-rank")


def write_info(directory, rank, info):
    path = info_path(directory, rank)
    with open(path + ".tmp", "w") as out:
        json.dump(info, out)
    os.replace(path + ".tmp", path)


def read_info(directory, rank):
    with open(info_path(directory, rank)) as f:
        return json.load(f)


def unpack(record):
    """(phase, requests, done, pid, step, buckets, time) of a record's bytes, or None if not one."""
    magic, phase, requests, done = HEADER.unpack_from(record, 0)
    if magic != MAGIC:
        return None
    pid, step, buckets, when = PROGRESS.unpack_from(record, PROGRESS_OFFSET)
    return phase, requests, done, pid, step, buckets, when
