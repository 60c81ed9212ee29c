"""Real torchrun under ddp-launch: how a run ends. The worker's exit code comes out of the
launcher (2, 75, crash 1) in one line, only crashes are restarted, TERM ends in 75, workers
die with a SIGKILLed launcher, and a node whose head never comes up gives up in time."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

WORKLOAD = textwrap.dedent(
    """
    import os, signal, sys, time
    mode, out = sys.argv[1], sys.argv[2]
    rank = os.environ["RANK"]
    open(os.path.join(out, f"start-{rank}-{os.getpid()}"), "w").close()
    if mode == "usage":
        if rank == "0":  # the rank that talks is the slower one: rank 1 exits 2 first
            time.sleep(1)
            print("workload: error: --epoch is not a flag: did you mean --epochs?", file=sys.stderr)
        sys.exit(2)
    if mode == "crash":
        sys.exit(3 if rank == "1" else 0)
    if mode == "stopped":
        sys.exit(75)
    if mode == "killed" and rank == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    def stop(signum, frame):
        # Written whole, then named: the test reads the file as soon as it exists.
        path = os.path.join(out, f"signal-{rank}")
        with open(path + ".tmp", "w") as f:
            f.write(str(signum))
        os.replace(path + ".tmp", path)
        sys.exit(75)
    signal.signal(signal.SIGTERM, stop)
    open(os.path.join(out, f"ready-{rank}"), "w").close()
    time.sleep(120)
    sys.exit(3)
    """
)


def clean_env(tmp_path: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_", "TORCHELASTIC_", "DDP_"))}
    return {**env, "HOME": str(tmp_path), **extra}


def launch_argv(tmp_path: Path, mode: str, *flags: str) -> list[str]:
    script = tmp_path / "workload.py"
    script.write_text(WORKLOAD)
    return [sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", "2", *flags,
            "--script", str(script), "--", mode, str(tmp_path)]


def run_launch(tmp_path: Path, mode: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(launch_argv(tmp_path, mode, *flags), env=clean_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)


def starts(tmp_path: Path, rank: int) -> int:
    return len(list(tmp_path.glob(f"start-{rank}-*")))


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def wait_for(paths: list[Path], process: subprocess.Popen, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while not all(path.exists() for path in paths):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"not all of {paths} appeared within {seconds} s"
        time.sleep(0.2)



def term_when_ready(launch: subprocess.Popen, ready) -> tuple[str, float]:
    """SIGTERM the launcher once ready() returns; its stderr and when the signal went.
    The launcher is never left running, whatever fails."""
    try:
        ready()
        sent = time.monotonic()
        launch.send_signal(signal.SIGTERM)
        _, err = launch.communicate(timeout=60)
        return err, sent
    finally:
        if launch.poll() is None:
            launch.kill()

def test_a_usage_error_exits_2_with_the_workers_line_alone_and_is_not_restarted(tmp_path):
    done = run_launch(tmp_path, "usage", "--max-restarts", "2")
    assert done.returncode == 2, done.stderr
    assert lines(done.stderr) == ["workload: error: --epoch is not a flag: did you mean --epochs?"]
    assert starts(tmp_path, 0) == 1  # --max-restarts 2 would have started it 3 times


def test_a_log_dir_that_cannot_be_created_is_one_line_and_exit_2_before_any_worker(tmp_path):
    (tmp_path / "a-file").write_text("")
    log_dir = tmp_path / "a-file" / "logs"  # a path under a regular file: ENOTDIR
    done = run_launch(tmp_path, "crash", "--log-dir", str(log_dir))
    assert done.returncode == 2, done.stderr
    assert lines(done.stderr) == [f"ddp-launch: error: --log-dir {log_dir} cannot be created (Not a directory): "
                                  "pass a directory you can write, or leave --log-dir out"]
    assert starts(tmp_path, 0) == 0


def test_a_crash_exits_1_in_one_summary_line_after_its_restarts(tmp_path):
    done = run_launch(tmp_path, "crash", "--max-restarts", "1")
    assert done.returncode == 1, done.stderr
    assert lines(done.stderr) == [
        f"ddp-launch: error: worker rank 1 on {socket.gethostname()} exited with 3 (crash): see its output above"]
    assert starts(tmp_path, 1) == 2  # a crash is what restarts are for


def test_a_worker_that_stops_with_75_is_not_restarted_and_the_launch_exits_75(tmp_path):
    done = run_launch(tmp_path, "stopped", "--max-restarts", "2")
    assert done.returncode == 75, done.stderr
    assert "Traceback" not in done.stderr
    assert starts(tmp_path, 0) == 1


def test_a_worker_killed_by_a_signal_is_a_crash_named_by_its_signal(tmp_path):
    done = run_launch(tmp_path, "killed")
    assert done.returncode == 1, done.stderr
    assert lines(done.stderr)[-1].startswith(
        f"ddp-launch: error: worker rank 0 on {socket.gethostname()} was killed by SIGKILL (crash)")
    assert "Traceback" not in done.stderr


def test_sigterm_to_the_launcher_reaches_the_workers_and_ends_in_75_without_a_restart(tmp_path):
    # scancel and preemption: SLURM sends TERM to the step's processes, then KILL after
    # KillWait (scancel(1), slurm.conf(5)); Kubernetes sends TERM to the container's PID 1
    # only, then KILL after terminationGracePeriodSeconds (Pod Lifecycle, "Termination of
    # Pods"). Here the launcher alone gets TERM, as under Kubernetes.
    launch = subprocess.Popen(launch_argv(tmp_path, "wait", "--max-restarts", "1"), env=clean_env(tmp_path),
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err, _ = term_when_ready(launch, lambda: wait_for([tmp_path / "ready-0", tmp_path / "ready-1"], launch))
    assert launch.returncode == 75, err
    assert "Traceback" not in err and "SignalException" not in err
    for rank in (0, 1):
        assert (tmp_path / f"signal-{rank}").read_text() == str(int(signal.SIGTERM))
        assert starts(tmp_path, rank) == 1


def test_workers_get_sigterm_and_end_when_their_launcher_is_sigkilled(tmp_path):
    launch = subprocess.Popen(launch_argv(tmp_path, "wait"), env=clean_env(tmp_path), cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for([tmp_path / "ready-0", tmp_path / "ready-1"], launch)
        launch.kill()
        launch.wait(timeout=30)
        # PR_SET_PDEATHSIG (ddp_launch.worker): the kernel sends each worker TERM, the
        # trainer's stop signal, so it checkpoints and exits instead of training on.
        signals = [tmp_path / "signal-0", tmp_path / "signal-1"]
        deadline = time.monotonic() + 30
        while not all(path.exists() for path in signals) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [path.exists() for path in signals] == [True, True], "orphaned workers got no signal"
        assert {path.read_text() for path in signals} == {str(int(signal.SIGTERM))}
        pids = [int(path.name.split("-")[2]) for path in tmp_path.glob("start-*")]
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "workers outlived their launcher"
    finally:
        for path in tmp_path.glob("start-*"):
            try:
                os.kill(int(path.name.split("-")[2]), signal.SIGKILL)
            except ProcessLookupError:
                pass


def slurm_step(tmp_path: Path, node: int, nodes: tuple[str, str] = ("localhost", "absent-node")) -> dict:
    """srun's variables for node `node` of a 2-node step, one task per node. One machine plays the
    step, so its socket interface is named: the plan must not depend on how many interfaces this
    machine has (a head whose name is loopback and that has several is refused, fabric/ethernet.py)."""
    return clean_env(tmp_path, SLURM_JOB_ID="42", SLURM_STEP_ID="0", SLURM_STEP_NODELIST=",".join(nodes),
                     SLURM_STEP_NUM_NODES="2", SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_NODEID=str(node),
                     SLURM_PROCID=str(node), SLURMD_NODENAME=nodes[node],
                     NCCL_SOCKET_IFNAME="lo", GLOO_SOCKET_IFNAME="lo")


NEVER = "raise SystemExit('workers must not start without the whole world')\n"


def wait_for_listener(port: int, process: subprocess.Popen, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"nothing listens on port {port} after {seconds} s"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)


def test_sigterm_while_waiting_for_the_other_nodes_ends_the_launch_with_75_at_once(tmp_path):
    (tmp_path / "never.py").write_text(NEVER)
    launch = subprocess.Popen(
        [sys.executable, "-m", "ddp_launch", "--cpu-workers", "1", "--rdzv-timeout", "120", "--script", "never.py"],
        env=slurm_step(tmp_path, 0), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the head's store listens on 20000 + (42 mod 1000) * 10 + 0
    err, stopped = term_when_ready(launch, lambda: wait_for_listener(20420, launch))
    assert launch.returncode == 75, err
    assert time.monotonic() - stopped < 30
    assert lines(err) == ["ddp-launch: job 42, 2 nodes: head node localhost "
                          "resolves to loopback 127.0.0.1 here: passing the name, port 20420",
                          "ddp-launch: stopped by SIGTERM while no worker was running: nothing to save; "
                          "resubmit or requeue to go on (exit 75)"]


def routable_local_ipv4() -> str:
    """This machine's address on its default route (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): only the route is looked up
        except OSError:
            pytest.skip("no IPv4 default route: a non-loopback head address is needed (loopback is refused "
                        "for a multi-node job)")
        return probe.getsockname()[0]


def closed_port() -> int:
    with socket.socket() as listener:
        listener.bind(("", 0))
        return listener.getsockname()[1]


def test_a_node_whose_head_never_comes_up_gives_up_within_the_rendezvous_timeout(tmp_path):
    # Node 2 of 2 under SLURM, the head's address answers but nothing listens on the port:
    # torchrun's c10d store client retries the connect until its read_timeout.
    head, port = routable_local_ipv4(), closed_port()
    (tmp_path / "never.py").write_text(NEVER)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ddp_launch", "--cpu-workers", "1", "--rdzv-host", head, "--rdzv-port", str(port),
         "--rdzv-timeout", "4", "--script", "never.py"],
        env=slurm_step(tmp_path, 1), cwd=tmp_path, capture_output=True, text=True, timeout=200)
    waited = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    # 4 s of timeout plus start-up (57 s once, on 2 cores beside the e2e clusters' training); the old
    # store read_timeout of 300 s kept it ~10 minutes.
    assert waited < 150, f"gave up after {waited:.0f} s"
    assert len(lines(done.stderr)) == 1, done.stderr
    assert lines(done.stderr)[0].startswith(f"ddp-launch: error: rendezvous store at {head}:{port} failed")


def test_a_bad_trainer_flag_through_the_launcher_is_the_trainers_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", "2", "--max-restarts", "1",
         "--", "--no-such-flag", "2"],
        env=clean_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stderr
    assert len(lines(done.stderr)) == 1, done.stderr
    assert lines(done.stderr)[0].startswith("ddp-train: error: ")
    assert "--no-such-flag" in done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")
def test_a_full_disk_under_the_workers_output_is_one_line_and_exit_2_from_every_rank(tmp_path):
    # /dev/full fails every write(2) with ENOSPC (null(4)): rank 0's first line cannot be written,
    # as where the disk holding <run-dir>/logs fills up. Both ranks stop at the next agreement.
    from ddp_train.synthetic import write_dataset

    write_dataset(tmp_path / "data", train=64, test=16, seed=2)
    argv = [sys.executable, "-m", "ddp_launch", "--mode", "local", "--cpu-workers", "2", "--",
            "--data-dir", str(tmp_path / "data"), "--run-dir", str(tmp_path / "run"), "--epochs", "1",
            "--width-scale", "0.0625", "--batch-size", "32", "--allow-unverified-data", "--device", "cpu"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, env=clean_env(tmp_path, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""),
                              cwd=tmp_path, stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    errors = [line for line in lines(done.stderr) if "error" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert errors[0].startswith("ddp-train: error: cannot write the output log /dev/full (ENOSPC: "), errors


# A usage error on the head node, as the other nodes see it. The head's launcher stops before its
# rendezvous store exists (here: its --nodes disagrees with SLURM, a LaunchError only it makes), or
# its rank 0 stops on a usage error once the workers run and the store goes with its agent. Without a
# word from the head, the other node waited for the store until srun's --wait killed it (137), or
# said "rendezvous store ... failed ... raise --rdzv-timeout". The head leaves its line in the run dir
# (ddp_contract.launcher_reports); the other node names it and ends with its code.

def two_node_run_dir(tmp_path: Path) -> tuple[Path, dict, dict]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    head, port = routable_local_ipv4(), closed_port()
    envs = [{**slurm_step(tmp_path, node), "DDP_RUN_DIR": str(run_dir), "DDP_NODE_NAME": f"node{node + 1}"}
            for node in (0, 1)]
    common = ["--cpu-workers", "1", "--rdzv-host", head, "--rdzv-port", str(port)]
    return run_dir, envs, {"common": common, "head": head, "port": port}


def test_the_other_node_names_a_usage_error_the_head_stopped_on_before_its_rendezvous(tmp_path):
    run_dir, (head_env, other_env), given = two_node_run_dir(tmp_path)
    (tmp_path / "never.py").write_text(NEVER)
    head = subprocess.run([sys.executable, "-m", "ddp_launch", *given["common"], "--nodes", "3", "--script",
                           "never.py"], env=head_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert head.returncode == 2, head.stderr
    said = lines(head.stderr)[-1]
    assert said.startswith("ddp-launch: error: ") and "3" in said, head.stderr
    assert json.loads((run_dir / "launcher-crash-node1.json").read_text())["line"] == said

    started = time.monotonic()
    other = subprocess.run([sys.executable, "-m", "ddp_launch", *given["common"], "--rdzv-timeout", "900",
                            "--script", "never.py"], env=other_env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
    # At once (the peer watch polls each second; the import of torch takes the rest: 57 s once, on 2
    # cores beside the e2e clusters), not after its store's timeout (half of 900 s) or srun's --wait.
    assert time.monotonic() - started < 300
    assert other.returncode == 2, other.stderr
    assert lines(other.stderr)[-1] == f"ddp-launch: error: node1's ddp-launch stopped first (exit 2): {said}; " \
                                      "this node stops too", other.stderr
    assert "raise --rdzv-timeout" not in other.stderr


USAGE_AFTER_INIT = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    dist.init_process_group("gloo")
    if os.environ["RANK"] == "0":
        time.sleep(1)
        print("workload: error: --run-dir runs/x is in use by job 7: pick another", file=sys.stderr)
        sys.exit(2)
    dist.barrier()
    """)


def test_the_other_node_names_the_heads_rank_0_usage_error_when_the_store_goes_with_it(tmp_path):
    run_dir, (head_env, other_env), given = two_node_run_dir(tmp_path)
    (tmp_path / "usage.py").write_text(USAGE_AFTER_INIT)
    argv = [sys.executable, "-m", "ddp_launch", *given["common"], "--rdzv-timeout", "120", "--script", "usage.py"]
    head = subprocess.Popen([*argv[:3], "--log-dir", str(tmp_path / "logs"), *argv[3:]], env=head_env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        other = subprocess.run(argv, env=other_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        _, head_err = head.communicate(timeout=120)
    finally:
        head.kill()
    assert head.returncode == 2, head_err
    line = "workload: error: --run-dir runs/x is in use by job 7: pick another"
    assert json.loads((run_dir / "launcher-crash-node1.json").read_text())["line"] == line
    assert other.returncode == 2, other.stderr
    assert f"ddp-launch: error: node1's ddp-launch stopped first (exit 2): {line}; the rendezvous at " \
           f"{given['head']}:{given['port']} ended with it" in other.stderr, other.stderr
    assert "raise --rdzv-timeout" not in other.stderr
