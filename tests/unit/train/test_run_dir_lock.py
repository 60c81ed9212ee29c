"""One job per run dir: <run-dir>/.ddp-run.lock, who may take it, and the trainer's refusal."""

from __future__ import annotations

import json
import os
import time

import pytest

from ddp_contract import rundir_lock
from ddp_contract.rundir_lock import STALE_AFTER_S, Owner, decide
from ddp_train import cli

ME = Owner("1001", "node1", 4242)
TINY = ["--allow-unverified-data", "--batch-size", "32", "--epochs", "1", "--width-scale", "0.0625",
        "--device", "cpu", "--no-tta"]


@pytest.fixture(autouse=True)
def _world_of_one(world_of_one):
    """In-process runs: a world of one (conftest.world_of_one)."""


@pytest.mark.parametrize("held_by, age_s, pid_alive, free", [
    (None, 0.0, False, False),                              # being written this instant: wait for it
    (None, STALE_AFTER_S + 1, False, True),                 # unreadable and old: stale
    (Owner("1001", "node7", 9), 1.0, True, True),           # this job, requeued or restarted
    (Owner("999", "node1", 9), 1.0, False, True),           # this host, its pid gone: killed
    (Owner("999", "node1", 9), 1.0, True, False),           # this host, alive
    (Owner("999", "node2", 9), 1.0, False, False),          # another host: its pid says nothing here
    (Owner("999", "node2", 9), STALE_AFTER_S + 1, True, True),  # no heartbeat: its node died
    (Owner("", "node2", 9), 1.0, False, False),             # a run outside a scheduler, elsewhere
])
def test_who_may_take_a_run_dir(held_by, age_s, pid_alive, free):
    assert (decide(held_by, age_s, ME, pid_alive) is None) == free


def test_a_lock_from_another_pid_namespace_on_this_host_is_not_judged_by_its_pid():
    # A container of its own (a pod's, `apptainer run --pid`) numbers its processes from 1 on the
    # same host name: its pid 9 is not this namespace's, gone or alive.
    other = Owner("999", "node1", 9, "boot/1000")
    assert decide(other, 1.0, ME._replace(pid_space="boot/2000"), pid_alive=False) is not None
    assert decide(other, STALE_AFTER_S + 1, ME._replace(pid_space="boot/2000"), pid_alive=True) is None
    # Same namespace, or a lock written before owners named theirs: the pid still decides.
    assert decide(other, 1.0, ME._replace(pid_space="boot/1000"), pid_alive=False) is None
    assert decide(other._replace(pid_space=""), 1.0, ME._replace(pid_space="boot/2000"), pid_alive=False) is None


def test_the_owner_names_its_job_by_ddp_job_id_and_reads_no_schedulers_variable():
    # ddp-launch exports DDP_JOB_ID from the scheduler's own variables (ddp_launch/job_identity.py);
    # the job scripts' host check sets it from SLURM_JOB_ID (slurm/lib/ddp.sh).
    assert rundir_lock.owner_here({"DDP_JOB_ID": "771234"}).job == "771234"
    assert rundir_lock.owner_here({"SLURM_JOB_ID": "771234"}).job == ""


def test_the_pid_namespace_is_the_boot_and_the_start_of_its_pid_1(tmp_path):
    # proc(5): /proc/[pid]/stat, field 22 starttime; the command name (field 2) may hold spaces and ')'.
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text("0f6d2c3e-7a1b-4c55-9e0d-2b8f4a6c1d77\n")
    (tmp_path / "1").mkdir()
    fields = ["S", "0", "1", "1", "0", "-1", "4194560", "31065", "2339826", "96", "3104", "65", "354", "6155",
              "2436", "20", "0", "1", "0", "27"] + ["0"] * 32
    (tmp_path / "1/stat").write_text("1 (pod (init) sh) " + " ".join(fields) + "\n")
    assert rundir_lock.pid_space(str(tmp_path)) == "0f6d2c3e-7a1b-4c55-9e0d-2b8f4a6c1d77/27"
    assert rundir_lock.pid_space(str(tmp_path / "absent")) == ""
    assert rundir_lock.pid_space().count("/") == 1  # this machine's /proc says it
    held = rundir_lock.RunDirLock(str(tmp_path), ME._replace(pid_space=rundir_lock.pid_space()))
    assert rundir_lock.parse_owner(held._content().decode()) == held.me


def test_a_run_outside_a_scheduler_is_not_the_same_job_as_another_one():
    assert decide(Owner("", "node2", 9), 1.0, ME._replace(job=""), False) is not None


def test_the_lock_is_created_named_and_removed(tmp_path):
    lock = rundir_lock.RunDirLock(str(tmp_path), ME._replace(pid=os.getpid(), host="here"))
    lock.acquire()
    held = json.loads((tmp_path / ".ddp-run.lock").read_text())
    assert (held["job"], held["host"], held["pid"]) == ("1001", "here", os.getpid())
    with pytest.raises(rundir_lock.LockHeld, match=r"is in use by job 1001 on here \(pid \d+, alive \d+ s ago\)"):
        rundir_lock.RunDirLock(str(tmp_path), Owner("1002", "there", 1)).acquire()
    lock.release()
    assert sorted(os.listdir(tmp_path)) == []


def test_a_stale_lock_is_taken_over_and_a_release_leaves_another_owners_lock(tmp_path):
    path = tmp_path / ".ddp-run.lock"
    path.write_text(json.dumps({"job": "7", "host": "gone-node", "pid": 1}))
    old = time.time() - STALE_AFTER_S - 5
    os.utime(path, (old, old))
    lock = rundir_lock.RunDirLock(str(tmp_path), ME)
    lock.acquire()
    assert json.loads(path.read_text())["job"] == "1001"
    path.write_text(json.dumps({"job": "8", "host": "x", "pid": 1}))  # someone took it since
    lock.release()
    assert path.exists()


def test_the_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir_lock, "HEARTBEAT_S", 0.05)
    lock = rundir_lock.RunDirLock(str(tmp_path), ME)
    lock.acquire()
    old = time.time() - 1000
    os.utime(tmp_path / ".ddp-run.lock", (old, old))
    time.sleep(0.5)
    assert time.time() - (tmp_path / ".ddp-run.lock").stat().st_mtime < 5
    lock.release()


def test_the_trainer_refuses_a_run_dir_another_job_holds_before_touching_it(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A live owner on another host, as the first job's rank 0 writes it.
    (run_dir / ".ddp-run.lock").write_text(json.dumps({"job": "77", "host": "node9", "pid": 1}))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    code = cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY])

    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"ddp-train: error: --run-dir {run_dir} is in use by job 77 on node9 (pid 1, alive ")
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_the_trainer_releases_its_lock_when_it_ends(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    assert cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY]) == 0
    assert not (run_dir / ".ddp-run.lock").exists()
    assert (run_dir / "checkpoint.pt").exists()
