"""The agent's hang watchdog: which local rank is named, where it stopped, and the real round trip
from a worker's heartbeat record to a stopped process's stacks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from stand_ins import nccl_ras as ras_stand_in

from ddp_contract import heartbeat as hb
from ddp_launch.watchdog import RAS_BUDGET_S, Beat, Watchdog, culprits, ras_budget_s, where_stopped

REPO = Path(__file__).resolve().parents[3]


def beat(rank: int, phase: int = hb.ALLREDUCE, step: int = 57, buckets: int = 4, idle_s: float = 30.0,
         state: str = "S") -> Beat:
    return Beat(rank, 100 + rank, "node2", phase, step, buckets, idle_s, 20.0, state, "/runs/x", 0)


def test_a_rank_the_kernel_stopped_is_named_even_if_it_got_as_far_as_its_peers():
    # SIGSTOP inside the all-reduce: every rank shows the same step and buckets (proc(5): T).
    beats = [beat(2), beat(3, state="T")]
    assert [b.rank for b in culprits(beats)] == [3]


def test_the_rank_furthest_behind_is_named_and_the_ones_waiting_for_it_are_not():
    beats = [beat(2), beat(3, phase=hb.STEP, buckets=0)]
    assert [b.rank for b in culprits(beats)] == [3]


def test_ranks_that_all_wait_at_the_same_point_wait_for_another_node():
    # DDP's forward broadcasts buffers: waiting ranks may sit in the forward too, so no phase is blamed.
    assert culprits([beat(0, phase=hb.STEP, buckets=0), beat(1, phase=hb.STEP, buckets=0)]) == []


def test_nothing_is_named_before_the_stall_threshold_nor_outside_the_watched_phases():
    assert culprits([beat(2), beat(3, state="T", idle_s=5.0)]) == []
    assert culprits([beat(2), beat(3, state="T", phase=hb.WARMUP)]) == []


def test_a_step_behind_counts_before_a_phase_behind():
    beats = [beat(0, step=58, phase=hb.STEP, buckets=0), beat(1, step=57, phase=hb.OPTIMIZER)]
    assert [b.rank for b in culprits(beats)] == [1]


STACKS = textwrap.dedent("""\
    Thread 0x00007f04a08296c0 (most recent call first):
      File "/usr/lib/python3.11/threading.py", line 331 in wait

    Thread 0x00007f055e61eb80 (most recent call first):
      File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 1072 in _engine_run_backward
      File "/venv/lib/python3.11/site-packages/torch/_tensor.py", line 623 in backward
      File "/work/src/ddp_train/train.py", line 124 in train_step
      File "/work/src/ddp_train/train.py", line 166 in train
    """)


def test_where_it_stopped_is_the_main_threads_innermost_frame_and_the_trainers_own():
    assert where_stopped(STACKS, 0x7F055E61EB80) == (
        "torch/autograd/graph.py:1072 in _engine_run_backward (from ddp_train/train.py:124 in train_step)")


def test_without_a_stack_it_says_so():
    assert "no Python stack" in where_stopped("", 1)


WORKER = textwrap.dedent("""\
    import sys, time
    from ddp_train.safety.heartbeat import Forensics
    from ddp_contract import heartbeat as hb
    f = Forensics.start({"DDP_HEARTBEAT_DIR": sys.argv[1]}, 3, 1, sys.argv[2], 2.0)
    f.heartbeat.step(41)
    f.heartbeat.bucket()
    def stuck_in_compute():
        print("ready", flush=True)  # in here: wherever the stop lands after this, it is in this function
        while True:
            time.sleep(0.05)
    stuck_in_compute()
    """)


def hang(tmp_path, env: dict, ras_job=None) -> tuple[list[str], Path, int]:
    """A real worker stopped in its compute and the watchdog that finds it, with NCCL's RAS answered by
    the stand-in for ras_job (a function of the worker's pid), or by nothing. (lines said, run dir,
    the worker's end)."""
    beats_dir, run_dir = tmp_path / "hb", tmp_path / "run"
    beats_dir.mkdir()
    child_env = {**os.environ, "PYTHONPATH": f"{REPO / 'entrypoints'}{os.pathsep}{REPO / 'src'}"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(beats_dir), str(run_dir)], env=child_env,
                              stdout=subprocess.PIPE, text=True)
    server = None
    try:
        assert worker.stdout.readline().strip() == "ready"
        if ras_job is not None:
            server = ras_stand_in.serve(ras_job(worker.pid))
            env = {**env, "NCCL_RAS_ADDR": f"127.0.0.1:{server.server_address[1]}"}
        os.kill(worker.pid, signal.SIGSTOP)
        said: list[str] = []
        dog = Watchdog(str(beats_dir), said.append, env)
        deadline = time.monotonic() + 20
        while not said and time.monotonic() < deadline:  # stall_after_s: half of 2.0 s
            dog.check()
            time.sleep(0.2)
        return said, run_dir, worker.wait(timeout=10)
    finally:
        worker.kill()
        if server is not None:
            server.shutdown()
            server.server_close()


def closed_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


def test_a_stopped_worker_is_named_with_its_step_and_place_its_stacks_land_in_the_run_dir_and_it_is_killed(
        tmp_path):
    port = closed_port()
    said, run_dir, end = hang(tmp_path, {"NCCL_RAS_ADDR": f"127.0.0.1:{port}"})
    assert len(said) == 2, said
    assert said[0].startswith("ddp-launch: error: rank 3 on ")
    assert "stopped advancing at step 41 (gradient all-reduce" in said[0]
    assert "stopped by a signal (T)" in said[0]
    assert "in stuck_in_compute" in said[0]  # time.sleep is C: the innermost Python frame is ours
    assert "most recent call first" in (run_dir / "forensics" / "stacks-rank3.txt").read_text()
    # No NCCL here (nothing on its RAS port): one line, and the culprit's end is not held up.
    assert said[1] == (f"ddp-launch: NCCL RAS: nothing listens on 127.0.0.1:{port} (NCCL older than 2.24, "
                       "NCCL_RAS_ENABLE=0, another NCCL_RAS_ADDR, or no NCCL in these workers): no verdict from NCCL")
    assert end == -signal.SIGKILL


def ras_job(version: str, rank_3_answers: bool):
    """NCCL's view of the hung worker's job: ranks 0-2 elsewhere, rank 3 the stopped worker on this host,
    missing from RAS's gathering (a stopped process's RAS thread is stopped too), or present with every
    count equal (NVIDIA/nccl#1730)."""
    def described(pid: int) -> dict:
        ranks = [{"rank": r, "host": "10.9.0.1", "pid": 9000 + r, "counts": {"AllReduce": 57}} for r in range(3)]
        me = {"rank": 3, "host": "127.0.0.1", "pid": pid, "gpu": 1, "counts": {"AllReduce": 57}}
        return {"nccl_version": version, "communicators": [{
            "hash": "0x1f", "size": 4, "ranks": ranks + ([me] if rank_3_answers else []),
            "missing": [] if rank_3_answers else [me]}]}
    return described


def test_the_hang_report_carries_the_verdict_of_nccls_ras_and_its_report(tmp_path):
    said, run_dir, end = hang(tmp_path, {}, ras_job("2.29.2", rank_3_answers=False))
    assert said[0].startswith("ddp-launch: error: rank 3 on "), said
    saved = run_dir / "forensics" / f"nccl-ras-{socket.gethostname()}.json"
    assert said[1].startswith("ddp-launch: NCCL RAS (NCCL 2.29.2, 1 communicator(s)): rank(s) 3 missing (process "), said
    assert said[1].endswith(f"; its report: {saved}"), said
    assert '"missing_ranks_count": 1' in saved.read_text()
    assert end == -signal.SIGKILL


def test_a_ras_that_says_ok_during_the_hang_is_reported_and_the_culprit_still_ends(tmp_path):
    said, _, end = hang(tmp_path, {}, ras_job("2.29.2", rank_3_answers=True))
    assert said[0].startswith("ddp-launch: error: rank 3 on ") and "NVIDIA/nccl#1730" in said[1], said
    assert end == -signal.SIGKILL


def test_ras_gets_at_most_half_of_what_the_collective_timeout_leaves():
    # stall_after_s 12: half of a 24 s timeout gone, 12 s left, 6 for RAS.
    assert ras_budget_s([Beat(0, 1, "n", hb.STEP, 1, 0, 9, 12.0, "S", "/r", 0)]) == 6.0
    assert ras_budget_s([Beat(0, 1, "n", hb.STEP, 1, 0, 9, 300.0, "S", "/r", 0)]) == RAS_BUDGET_S
    assert ras_budget_s([Beat(0, 1, "n", hb.STEP, 1, 0, 9, 0.5, "S", "/r", 0)]) == 1.0


def test_a_record_from_an_earlier_worker_with_the_same_rank_is_not_read_as_this_one(tmp_path):
    (tmp_path / "rank-0.json").write_text('{"pid": 1, "node": "n", "run_dir": "/r", "stall_after_s": 1}')
    record = bytearray(hb.RECORD_SIZE)
    hb.HEADER.pack_into(record, 0, hb.MAGIC, hb.STEP, 0, 0)
    hb.PROGRESS.pack_into(record, hb.PROGRESS_OFFSET, 2, 5, 0, 0.0)  # pid 2, not 1
    (tmp_path / "rank-0.hb").write_bytes(bytes(record))
    assert Watchdog(str(tmp_path)).read() == []


def test_a_record_caught_mid_write_with_a_time_of_zero_is_read_again_not_called_hung(tmp_path):
    # struct.pack_into zeroes its span before packing: a read in that moment saw a time of 0, which
    # is "idle since boot" (93,332 s once) and stalled the rank. Such a record is skipped until the next poll.
    (tmp_path / "rank-0.json").write_text('{"pid": 1, "node": "n", "run_dir": "/r", "stall_after_s": 1}')
    record = bytearray(hb.RECORD_SIZE)
    hb.HEADER.pack_into(record, 0, hb.MAGIC, hb.OPTIMIZER, 0, 0)
    hb.PROGRESS.pack_into(record, hb.PROGRESS_OFFSET, 1, 0, 0, 0.0)
    (tmp_path / "rank-0.hb").write_bytes(bytes(record))
    assert Watchdog(str(tmp_path)).read() == []
    hb.PROGRESS.pack_into(record, hb.PROGRESS_OFFSET, 1, 0, 0, time.monotonic())
    (tmp_path / "rank-0.hb").write_bytes(bytes(record))
    [beat] = Watchdog(str(tmp_path)).read()
    assert beat.step == 0 and beat.idle_s < 60 and not beat.stalled


def test_a_heartbeat_directory_removed_as_the_launch_ends_is_read_as_empty_and_said_nothing_of(tmp_path):
    # The agent removes the directory once torchrun returns; the watchdog's thread may be between two
    # polls then. A warning there came after the launch's own last line (a crash's summary).
    gone = tmp_path / "ddp-heartbeat-gone"
    said = []
    dog = Watchdog(str(gone), said.append)
    assert dog.read() == []
    dog.check()
    assert said == []
