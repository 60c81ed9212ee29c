"""The worker's side of hang forensics: the Flight Recorder under gloo, and where its dump goes."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

from ddp_train.safety.heartbeat import FR_DUMP_VARS, Forensics, stall_after_s, use_run_dir_for_flight_recorder

GLOO_DUMP = textwrap.dedent("""\
    import datetime, sys, torch, torch.distributed as dist
    from ddp_train.safety.heartbeat import dump_flight_recorder
    store = dist.FileStore(sys.argv[2], 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    dist.all_reduce(torch.ones(4))
    print(dump_flight_recorder(sys.argv[1], 0))
    dist.destroy_process_group()
    """)


def test_gloo_records_its_collectives_in_the_flight_recorder_and_the_dump_lands_in_the_run_dir(tmp_path):
    # torch 2.14: gloo records into the Flight Recorder, but only ProcessGroupNCCL dumps it on a
    # timeout itself; so the trainer dumps it when the watchdog asks.
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
    done = subprocess.run([sys.executable, "-c", GLOO_DUMP, str(tmp_path / "run"), str(tmp_path / "store")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    dump = Path(done.stdout.strip())
    assert dump == tmp_path / "run" / "forensics" / "fr-trace-rank0"
    entries = pickle.loads(dump.read_bytes())["entries"]
    assert [e["profiling_name"] for e in entries] == ["gloo:all_reduce"]


def test_a_flight_recorder_dump_that_cannot_be_written_is_a_warning_not_a_thread_traceback(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "forensics").write_text("a file where the dump directory goes")  # mkdir fails: EEXIST
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
    done = subprocess.run([sys.executable, "-c", GLOO_DUMP, str(run_dir), str(tmp_path / "store")],
                          env=env, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("ddp-train: warning: rank 0: ")]
    assert len(warnings) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"cannot write its Flight Recorder dump {run_dir}/forensics/fr-trace-rank0" in warnings[0]


def test_the_dump_prefix_goes_into_the_run_dir_unless_the_user_chose_one():
    environ: dict[str, str] = {}
    assert use_run_dir_for_flight_recorder("/runs/a", {}, environ) == "/runs/a/forensics/fr-trace-rank"
    assert environ == {"TORCH_FR_DUMP_TEMP_FILE": "/runs/a/forensics/fr-trace-rank"}
    for name in FR_DUMP_VARS:
        kept: dict[str, str] = {}
        assert use_run_dir_for_flight_recorder("/runs/a", {name: "/scratch/fr_"}, kept) is None
        assert kept == {}


def test_without_an_agent_there_is_no_heartbeat_and_it_costs_nothing():
    forensics = Forensics.start({}, 0, 0, "/runs/a", 600.0)
    assert not forensics.heartbeat.enabled
    forensics.heartbeat.step(1)  # a no-op
    forensics.stop()


def test_a_rank_is_called_hung_at_half_the_collective_timeout():
    assert stall_after_s(600.0) == 300.0
