"""A training step that put spares in bad nodes' places (src/ddp_train/recovery.py): the parts of the
time from the fault to training again, the "recovery" record and its one line."""

import json
import subprocess
import sys
import time

import pytest

from train_helpers import TINY_ARGS, trainer_env
from ddp_contract import RECOVERY_VAR
from ddp_train import recovery

SWAP = {"node": "node2", "by": "roll-call", "why": "lost mid-run: Connection reset by peer", "spare": "node4"}


def _env(**fields):
    data = {"swaps": [SWAP], "fault_at": 100.0, "named_at": 115.0, "old_step_ended_at": 152.0,
            "step_started_at": 152.5, **fields}
    return {RECOVERY_VAR: json.dumps(data)}


def _clock(**marks):
    clock = recovery.StartClock()
    clock.marks.update(marks)
    return clock


def test_each_part_runs_from_the_last_known_mark_and_they_add_up_to_the_whole():
    found = recovery.from_env(_env())
    clock = _clock(rendezvous_started_at=154.0, process_started_at=155.0, group_ready_at=158.0,
                   resume_started_at=159.0, resume_done_at=159.5, training_at=161.0)
    marks = {**found.marks, **clock.marks}
    assert recovery.parts(marks) == [
        ("detection", 15.0), ("old step's end", 37.0), ("job script", 0.5), ("new step's start", 1.5),
        ("rendezvous", 1.0), ("process group", 3.0), ("data and model", 1.0), ("checkpoint load", 0.5),
        ("warm-up and compile", 1.5)]
    assert sum(seconds for _, seconds in recovery.parts(marks)) == recovery.total_s(marks) == 61.0


def test_a_preflight_fault_has_no_roll_call_no_old_step_and_task_mode_no_agent():
    found = recovery.from_env(_env(fault_at=100.0, named_at=100.0, old_step_ended_at=None, step_started_at=130.0))
    marks = {**found.marks, **_clock(process_started_at=131.0, group_ready_at=133.0, resume_started_at=134.0,
                                     resume_done_at=134.0, training_at=135.0).marks}
    assert [part for part, _ in recovery.parts(marks)] == [
        "detection", "job script", "new step's start", "process group and rendezvous", "data and model",
        "checkpoint load", "warm-up and compile"]
    assert recovery.parts(marks)[1] == ("job script", 30.0)  # the placement and the fabric gate before the step


def test_the_line_names_the_node_the_spare_and_the_seconds_to_training_again():
    line = recovery.line(recovery.from_env(_env()), _clock(training_at=161.0))
    assert line.startswith("Recovered: replaced node2 (named by the roll call) by spare node4; "
                           "training again 61.0 s after the fault (detection 15.0 s, old step's end 37.0 s, ")
    assert "\n" not in line


def test_the_record_keeps_the_swaps_the_total_the_parts_and_every_mark():
    record = recovery.record(recovery.from_env(_env()), _clock(training_at=161.0))
    assert record["swaps"] == [SWAP] and record["seconds"] == 61.0
    assert record["parts"]["detection"] == 15.0
    assert record["marks"]["fault_at"] == 100.0 and record["marks"]["training_at"] == 161.0
    json.dumps(record)  # a metrics.jsonl line


@pytest.mark.parametrize("text", ["", "{not json", json.dumps({"swaps": []}), json.dumps({"swaps": [{"node": 1}]}),
                                  json.dumps([1, 2])])
def test_anything_but_the_job_scripts_recovery_is_no_recovery(text):
    assert recovery.from_env({RECOVERY_VAR: text}) is None


def test_a_missing_fault_time_still_gives_the_parts_after_it_and_no_total():
    found = recovery.from_env(_env(fault_at=None, named_at=None, old_step_ended_at=None))
    marks = {**found.marks, "training_at": 160.0}
    assert recovery.total_s(marks) is None
    assert recovery.parts(marks) == [("warm-up and compile", 7.5)]
    assert "training again (" in recovery.line(found, _clock(training_at=160.0))


def test_the_process_start_is_read_from_proc(tmp_path, monkeypatch):
    (tmp_path / "self").mkdir()
    # proc(5): after "(comm)", field 3 is the state; field 22, starttime, is the 20th after the name.
    fields = ["S"] + ["0"] * 18 + ["12345"]
    (tmp_path / "self" / "stat").write_text("4242 (python3 (x)) " + " ".join(fields) + " 0 0\n")
    (tmp_path / "stat").write_text("cpu 1 2 3\nbtime 1700000000\n")
    monkeypatch.setattr(recovery.os, "sysconf", lambda name: 100)
    assert recovery.process_start_time(str(tmp_path)) == 1700000000 + 123.45
    assert recovery.process_start_time(str(tmp_path / "absent")) is None


def test_a_restart_by_torchrun_of_the_same_step_records_nothing_again():
    assert recovery.first_start({}) and recovery.first_start({"TORCHELASTIC_RESTART_COUNT": "0"})
    assert not recovery.first_start({"TORCHELASTIC_RESTART_COUNT": "1"})


def _records(run_dir, kind):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


def test_a_recovery_step_of_the_real_trainer_writes_one_record_and_says_it_once(ten_class_data, tmp_path):
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ddp_train",
            "--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS, "--target-accuracy", "1.1",
            "--epochs", "3", "--checkpoint-every", "2", "--limit-train", "192"]  # the records count, not learning
    first = subprocess.run(args, env=trainer_env(), capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr
    assert _records(tmp_path, "recovery") == []  # no DDP_RECOVERY, no record
    # Back to epoch 2's checkpoint, as if a node was lost in epoch 3 (the finished run's is kept aside).
    (tmp_path / "checkpoint.prev.pt").replace(tmp_path / "checkpoint.pt")

    fault_at = time.time()
    env = trainer_env(**{RECOVERY_VAR: json.dumps({"swaps": [SWAP], "fault_at": fault_at - 30.0,
                                                   "named_at": fault_at - 15.0, "old_step_ended_at": None,
                                                   "step_started_at": fault_at})})
    # With the job scripts' gate in the trainer's ranks (ddp-train --fabric-gate): the spare is gated
    # before the first step, and the recovery counts the gate's seconds as a part of their own.
    again = subprocess.run([*args, "--fabric-gate"], env=env, capture_output=True, text=True, timeout=180)

    assert again.returncode == 0, again.stderr
    assert "fabric gate: PASS in " in again.stdout and json.loads((tmp_path / "gate.json").read_text())["ok"]
    [record] = _records(tmp_path, "recovery")
    assert record["swaps"] == [SWAP] and 30.0 < record["seconds"] < 150.0
    assert {"detection", "fabric gate", "checkpoint load", "warm-up and compile"} <= set(record["parts"])
    assert record["marks"]["group_ready_at"] <= record["marks"]["gate_done_at"] <= record["marks"]["resume_started_at"]
    assert record["marks"]["resume_done_at"] >= record["marks"]["resume_started_at"]
    lines = [line for line in again.stdout.splitlines() if line.startswith("Recovered: ")]
    assert len(lines) == 1 and "replaced node2 (named by the roll call) by spare node4" in lines[0]
    # after the resumed run's start, before its first epoch: epoch 3, from epoch 2's checkpoint
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    at = [r["type"] for r in records].index("recovery")
    assert records[at - 1]["type"] == "run" and records[at - 1]["resumed_from_epoch"] == 2
    assert records[at + 1]["type"] == "epoch" and records[at + 1]["epoch"] == 3
