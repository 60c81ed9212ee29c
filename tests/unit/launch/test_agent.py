"""The torchrun agent wrapper: exit codes from the workers' own, restarts for crashes only,
stop signals forwarded (real torchrun runs of these are in test_launch_outcomes.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddp_launch.agent import (EXIT_REQUEUE, StopRequest, child_pids, crash_summary,
                              first_crash, first_line, full_log_dir_note, is_retried, launcher_exit_code, rendezvous_failure,
                              retry_crashes_only, write_crash_report)


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


WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    rank = os.environ["RANK"]
    stopped = []
    # Like the trainer, a TERM after the stop does not kill it: torchrun TERMs the other workers
    # once one has exited 75, and a worker that died of it between open and write left an empty
    # file under load.
    def stop(signum, frame):
        if stopped:
            return
        stopped.append(signum)
        with open(os.path.join(out, f"signal-{rank}"), "w") as record:
            record.write(str(signum))
        sys.exit(75)
    signal.signal(signal.SIGUSR2, stop)
    signal.signal(signal.SIGTERM, stop)
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
        deadline = time.monotonic() + 600  # a hang's bound, not the behaviour: a starved run takes minutes
        while not all((tmp_path / f"ready-{rank}").exists() for rank in (0, 1)):
            assert launch.poll() is None, launch.stdout.read()
            assert time.monotonic() < deadline, "workers did not start within 600 s"
            time.sleep(0.2)
        launch.send_signal(signal.SIGUSR2)
        output, _ = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == EXIT_REQUEUE, output
    for rank in (0, 1):
        assert (tmp_path / f"signal-{rank}").read_text() == str(int(signal.SIGUSR2))
    assert "stopped on a signal" in output


@pytest.mark.parametrize(("body", "how", "reported"), [
    # Every worker of the node killed at once (the OOM killer, a user's pkill): the roll call of the
    # other nodes hears none of its ranks, as for a lost node; this launcher lived to say so.
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "was killed by SIGKILL (crash)", True),
    # A worker that exits on its own may have lost its peers (PeerLost on a node cut off the network).
    ("raise SystemExit(1)\n", "exited with 1 (crash)", False),
])
def test_a_node_whose_workers_are_killed_says_in_the_run_dir_that_it_is_up(tmp_path, body, how, reported):
    script = tmp_path / "worker.py"
    script.write_text(body)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_"))}
    env.update(DDP_RUN_DIR=str(run_dir), DDP_NODE_NAME="node2")
    done = subprocess.run(
        [sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", "2", "--script", str(script)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    assert how in done.stderr
    if not reported:
        assert list(run_dir.glob("launcher-crash-*")) == []
        return
    record = json.loads((run_dir / "launcher-crash-node2.json").read_text())
    assert record["node"] == "node2" and record["exitcode"] == -9 and record["rank"] in (0, 1)
    assert list(run_dir.glob("*.tmp")) == []


def test_a_crash_report_is_written_only_in_a_job_and_a_run_dir_it_cannot_write_is_a_warning(tmp_path):
    assert write_crash_report({}, "host1", 0, 1, 10.0) is None
    assert list(tmp_path.iterdir()) == []
    assert write_crash_report({"DDP_RUN_DIR": str(tmp_path)}, "host1", 3, 1, 10.0) is None  # named by the host
    assert json.loads((tmp_path / "launcher-crash-host1.json").read_text()) == {
        "node": "host1", "rank": 3, "exitcode": 1, "at": 10.0}
    warning = write_crash_report({"DDP_RUN_DIR": str(tmp_path / "absent")}, "host1", 0, 1, 10.0)
    assert warning.startswith(f"ddp-launch: warning: cannot write {tmp_path}/absent/launcher-crash-host1.json (")
    assert warning.endswith("the job script may take host1 for a lost node")


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
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
           # The packages from this checkout also where they are not installed (a GPU machine's
           # copy), and no GPU: this test means the CPU rendezvous.
           "PYTHONPATH": os.pathsep.join(str(Path(__file__).resolve().parents[3] / d) for d in ("entrypoints", "src")),
           "CUDA_VISIBLE_DEVICES": "",
           # One machine plays both nodes: its socket interface is named, so the plan does not
           # depend on how many interfaces this machine has (fabric/ethernet.py refuses to guess
           # on a head whose name is loopback and which has several).
           "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
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


@pytest.mark.parametrize(("codes", "exit_code"), [
    ([2], 2), ([2, 2], 2),
    ([2, -15], 2),        # rank 0's usage error; torchrun then TERMs rank 1 and lists it too
    ([75, 75], 75), ([75, -15], 75),
    ([2, 75], 2),         # requeueing cannot fix a usage error
    ([76, 76], 76), ([76, -15], 76),   # the fabric gate named a bad node: requeue without it
    ([2, 76], 2), ([76, 75], 76), ([76, 1], 1),
    ([1], 1), ([3], 1), ([2, 1], 1), ([75, 1], 1),
    ([-9], 1), ([75, -9], 1),   # KILL is also the OOM killer: a crash
    ([-15], 1),           # killed by TERM and nothing else failed: a crash
    ([], 1),
])
def test_the_launcher_exits_with_the_workers_own_code_and_any_crash_is_1(codes, exit_code):
    assert launcher_exit_code(codes) == exit_code


@pytest.mark.parametrize(("codes", "stop_requested", "retried"), [
    ([1], False, True), ([-11], False, True), ([2, 1], False, True),
    ([2], False, False), ([75], False, False), ([2, -15], False, False), ([76], False, False),
    ([1], True, False),   # after a stop request nothing starts again
])
def test_only_crashes_are_restarted_and_never_after_a_stop(codes, stop_requested, retried):
    assert is_retried(codes, stop_requested) is retried


class FakeFailure:
    def __init__(self, exitcode: int, timestamp: int = 0):
        self.exitcode, self.timestamp = exitcode, timestamp


class FakeResult:
    def __init__(self, *codes: int):
        self.failures = {rank: FakeFailure(code) for rank, code in enumerate(codes)}

    def is_failed(self) -> bool:
        return bool(self.failures)


def fake_agent_class(result: FakeResult) -> type:
    class Agent:  # the two members of SimpleElasticAgent the hook relies on
        def __init__(self):
            self._remaining_restarts = 3

        def _monitor_workers(self, worker_group):
            return result
    return Agent


@pytest.mark.parametrize(("codes", "stop_signal", "left"), [
    ((2, -15), None, 0), ((75,), None, 0), ((1,), None, 3), ((1,), signal.SIGTERM, 0), ((), None, 3),
])
def test_the_restart_hook_zeroes_the_restarts_left_unless_the_failure_is_a_crash(codes, stop_signal, left):
    agent_class = fake_agent_class(FakeResult(*codes))
    stop = StopRequest(children=lambda: [], stop_now=lambda signum: None)
    stop.signum = stop_signal
    assert retry_crashes_only(agent_class, stop) is True
    agent = agent_class()
    assert agent._monitor_workers(None).failures.keys() == dict.fromkeys(range(len(codes))).keys()
    assert agent._remaining_restarts == left


def test_the_restart_hook_reports_a_torch_without_the_method_it_wraps():
    assert retry_crashes_only(type("Renamed", (), {}), StopRequest(lambda: [], lambda signum: None)) is False


def test_the_real_elastic_agent_still_has_what_the_restart_hook_relies_on():
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    import inspect

    assert callable(getattr(LocalElasticAgent, "_monitor_workers", None))
    loop = inspect.getsource(SimpleElasticAgent._invoke_run)
    assert "self._monitor_workers(" in loop and "self._remaining_restarts > 0" in loop


def test_a_stop_signal_goes_to_every_worker_and_the_first_one_is_remembered():
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        stop = StopRequest(children=lambda: [p.pid for p in sleepers], stop_now=pytest.fail)
        stop.handle(signal.SIGUSR2)
        stop.handle(signal.SIGTERM)
        assert [p.wait(timeout=30) for p in sleepers] == [-signal.SIGUSR2, -signal.SIGUSR2]
        assert stop.signum == signal.SIGUSR2
    finally:
        for p in sleepers:
            p.kill()


def test_a_stop_signal_with_no_worker_running_stops_the_agent_now():
    stopped = []
    StopRequest(children=lambda: [], stop_now=stopped.append).handle(signal.SIGTERM)
    assert stopped == [signal.SIGTERM]


def test_the_crash_reported_is_the_first_worker_that_failed_on_its_own():
    failures = {0: FakeFailure(-15, timestamp=5), 3: FakeFailure(139, timestamp=5), 1: FakeFailure(1, timestamp=7)}
    assert first_crash(failures)[0] == 3


@pytest.mark.parametrize(("exitcode", "log_dir", "expected"), [
    (3, None, "ddp-launch: error: worker rank 5 on node2 exited with 3 (crash): see its output above"),
    (-9, None, "ddp-launch: error: worker rank 5 on node2 was killed by SIGKILL (crash): see its output above"),
    (1, "/logs", "ddp-launch: error: worker rank 5 on node2 exited with 1 (crash): see its output above "
                 "(lines starting 'node2:rank5:') or its log under /logs"),
])
def test_a_crash_is_summed_up_in_one_line_naming_rank_host_and_code(exitcode, log_dir, expected):
    assert crash_summary(5, "node2", exitcode, log_dir) == expected


def test_a_store_error_is_reported_by_its_innermost_cause_without_stack_frames():
    try:
        try:
            raise RuntimeError("The client socket has timed out after 2000ms while trying to connect to "
                               "(10.0.0.1, 20420).\nException raised from throwTimeoutError at socket.cpp:1030\n"
                               "frame #0: c10::Error::Error(...)")
        except RuntimeError as inner:
            raise ValueError("The connection to the C10d store has failed. See inner exception.") from inner
    except ValueError as outer:
        assert first_line(outer) == ("The client socket has timed out after 2000ms while trying to connect to "
                                     "(10.0.0.1, 20420).")


def test_a_rendezvous_port_in_use_on_the_head_is_named_with_its_fix():
    # What torch's TCPStore server says when bind(2) fails with EADDRINUSE (torch 2.x, socket.cpp).
    detail = ("The server socket has failed to listen on any local network address. port: 20420, useIpv6: false, "
              "code: -98, name: EADDRINUSE, message: address already in use")
    line = rendezvous_failure("connection", "10.0.0.1:20420", "2", detail)
    assert line.startswith("ddp-launch: error: rendezvous port 20420 on the head node (10.0.0.1:20420) is already in use")
    assert "--rdzv-port / DDP_LAUNCH_RDZV_PORT" in line and "\n" not in line


def test_workers_that_failed_with_their_logs_on_a_full_disk_get_a_line_saying_so(tmp_path):
    # torchrun's --tee shows a worker's lines by reading its log file back: a line the disk had no
    # room for never reaches the job's output, the worker's own error line included.
    line = full_log_dir_note("/runs/a/logs/7/node1", free_bytes=lambda _path: 12 * 1024)
    assert line == ("ddp-launch: error: the workers' logs under /runs/a/logs/7/node1 are on a full file system "
                    "(12 KiB free), so their own error lines may be missing above: free space there, or pass "
                    "another --run-dir")
    assert full_log_dir_note("/runs/a/logs", free_bytes=lambda _path: 1 << 30) is None
    assert full_log_dir_note(None) is None


def test_the_free_space_of_the_log_dir_is_read_from_its_file_system(tmp_path):
    stats = os.statvfs(tmp_path)
    assert stats.f_bavail * stats.f_frsize > 1 << 20  # a test machine's temporary directory has room
    assert full_log_dir_note(str(tmp_path)) is None
    assert full_log_dir_note(str(tmp_path / "not-created-yet")) is None  # statvfs fails: nothing to add
