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

from ddp_launch.agent import EXIT_STOPPED, all_stopped_for_requeue, child_pids


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
