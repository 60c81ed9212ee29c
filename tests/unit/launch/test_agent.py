"""The torchrun agent wrapper: USR1/USR2 reach the workers, and a signal-stop exits 75."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddp_launch.agent import EXIT_STOPPED, all_stopped_for_requeue, child_pids, rendezvous_failure


def write_stat(proc: Path, pid: int, comm: str, ppid: int) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")


def test_child_pids_reads_parent_field_even_when_command_name_has_spaces_and_parens(tmp_path):
    write_stat(tmp_path, 10, "python", 1)
    write_stat(tmp_path, 11, "weird ) name (x", 10)
    write_stat(tmp_path, 12, "python", 10)
    write_stat(tmp_path, 13, "python", 11)
    (tmp_path / "self").mkdir()
    assert sorted(child_pids(10, proc=str(tmp_path))) == [11, 12]


@pytest.mark.parametrize(
    ("codes", "stopped"),
    [([75, 75], True), ([75], True), ([75, 1], False), ([1], False), ([], False), ([-9, 75], False)],
)
def test_only_an_all_workers_signal_stop_counts_as_stopped_for_requeue(codes, stopped):
    assert all_stopped_for_requeue(codes) is stopped


WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    rank = os.environ["RANK"]
    def stop(signum, frame):
        open(os.path.join(out, f"signal-{rank}"), "w").write(str(signum))
        sys.exit(75)
    signal.signal(signal.SIGUSR2, stop)
    open(os.path.join(out, f"ready-{rank}"), "w").close()
    time.sleep(120)
    sys.exit(3)
    """
)


def test_usr2_to_the_launch_reaches_every_worker_and_the_job_exits_75(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_"))}
    launch = subprocess.Popen(
        [sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", "2",
         "--script", str(script), "--", str(tmp_path)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"ready-{rank}").exists() for rank in (0, 1)):
            assert launch.poll() is None, launch.stdout.read()
            assert time.monotonic() < deadline, "workers did not start within 90 s"
            time.sleep(0.2)
        launch.send_signal(signal.SIGUSR2)
        output, _ = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == EXIT_STOPPED, output
    for rank in (0, 1):
        assert (tmp_path / f"signal-{rank}").read_text() == str(int(signal.SIGUSR2))
    assert "stopped on a signal" in output


def test_rendezvous_failures_name_the_endpoint_and_the_fix():
    timeout = rendezvous_failure("timeout", "10.0.0.1:20420", "2", "")
    assert "rendezvous at 10.0.0.1:20420 timed out before all 2 node(s) joined" in timeout
    assert "--rdzv-timeout" in timeout and "\n" not in timeout
    broken = rendezvous_failure("connection", "head:20420", "2", "connection refused")
    assert "rendezvous store at head:20420 failed (connection refused)" in broken


def test_a_node_that_never_joins_times_the_real_rendezvous_out_in_one_line(tmp_path):
    # A real torchrun c10d rendezvous for 2 nodes where only the head starts: SLURM
    # step variables as srun sets them on the first node of two.
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0",
           "SLURM_STEP_NODELIST": "localhost,absent-node", "SLURM_STEP_NUM_NODES": "2",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "0", "SLURM_PROCID": "0"}
    script = tmp_path / "never.py"
    script.write_text("raise SystemExit('workers must not start without the whole world')\n")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ddp_launch", "--cpu-workers", "1", "--rdzv-timeout", "3",
         "--script", str(script)],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 60
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("ddp-launch: error: rendezvous at localhost:")
    assert "timed out before all 2 node(s) joined" in lines[-1]
    assert "Traceback" not in done.stderr
