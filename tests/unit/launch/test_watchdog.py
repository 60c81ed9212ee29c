"""The agent's hang watchdog: which local rank is named, where it stopped, and the real round trip
from a worker's heartbeat record to a stopped process's stacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ddp_contract import heartbeat as hb
from ddp_launch.watchdog import Beat, Watchdog, culprits, where_stopped

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


def test_a_stopped_worker_is_named_with_its_step_and_place_its_stacks_land_in_the_run_dir_and_it_is_killed(
        tmp_path):
    beats_dir, run_dir = tmp_path / "hb", tmp_path / "run"
    beats_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'entrypoints'}{os.pathsep}{REPO / 'src'}"}
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(beats_dir), str(run_dir)], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        os.kill(worker.pid, signal.SIGSTOP)
        said: list[str] = []
        dog = Watchdog(str(beats_dir), said.append)
        deadline = time.monotonic() + 20
        while not said and time.monotonic() < deadline:  # stall_after_s: half of 2.0 s
            dog.check()
            time.sleep(0.2)
        assert len(said) == 1, said
        assert said[0].startswith("ddp-launch: error: rank 3 on ")
        assert "stopped advancing at step 41 (gradient all-reduce" in said[0]
        assert "stopped by a signal (T)" in said[0]
        assert "in stuck_in_compute" in said[0]  # time.sleep is C: the innermost Python frame is ours
        assert "most recent call first" in (run_dir / "forensics" / "stacks-rank3.txt").read_text()
        assert worker.wait(timeout=10) == -signal.SIGKILL
    finally:
        worker.kill()


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
