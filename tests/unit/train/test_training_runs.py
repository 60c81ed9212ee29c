"""Real training runs on generated CIFAR-format data: it learns, DDP keeps ranks identical,
evaluation counts every test image once, and a run stopped by a signal resumes exactly."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from train_helpers import TINY_ARGS, run_trainer, trainer_env
from ddp_train.errors import EXIT_REQUEUE


def records(run_dir: Path, record_type: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == record_type]


def test_learns_far_above_chance_in_a_few_cpu_epochs(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "3", "--base-lr", "0.05", "--target-accuracy", "1.1"])
    assert result.returncode == 0, result.stderr
    accuracy = records(tmp_path, "summary")[0]["final_accuracy"]
    # 10 classes: chance (or shuffled labels, or a broken gradient) is about 0.1.
    assert accuracy > 0.6


def test_two_gloo_ranks_end_identical_and_evaluate_every_test_image_once(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "2"], torchrun_nproc=2)
    assert result.returncode == 0, result.stderr
    summary = records(tmp_path, "summary")[0]
    assert summary["world_size"] == 2 and summary["nodes"] == 1
    digests = summary["parameter_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert [e["val_total"] for e in records(tmp_path, "epoch")] == [203, 203]  # 203 is odd
    out = result.stdout
    assert out.count("Training completed successfully.") == 1  # rank 0 only
    for line in ("Number of nodes: 1", "World size: 2", f"Metrics: {tmp_path}/metrics.jsonl"):
        assert line in out
    graphs = "CUDA graphs, ranks 0-1: not used (CPU: CUDA graphs need a GPU)"
    assert out.count(graphs) == 2 and out.index(graphs) < out.index("Epoch 1/2")  # first lines, summary
    assert summary["cuda_graphs"] == [{"rank": r, "state": "not used", "detail": "CPU: CUDA graphs need a GPU"}
                                      for r in (0, 1)]


def final_weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


def test_signal_stops_with_a_checkpoint_and_resume_matches_an_uninterrupted_run(ten_class_data, tmp_path):
    args = ["--data-dir", str(ten_class_data), *TINY_ARGS, "--epochs", "4",
            "--target-accuracy", "1.1", "--stop-check-every", "1", "--seed", "7"]
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    assert run_trainer([*args, "--run-dir", str(straight)]).returncode == 0

    cmd = [sys.executable, "-m", "ddp_train", *args, "--run-dir", str(stopped)]
    proc = subprocess.Popen(cmd, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 600  # a hang's bound, not the behaviour: a starved run takes minutes
    while not (stopped / "metrics.jsonl").exists() or not records(stopped, "epoch"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_REQUEUE, err
    assert "Stop requested (SIGUSR2)" in out and "Training completed" not in out
    assert records(stopped, "stopped")[0]["signal"] == "SIGUSR2"
    assert (stopped / "checkpoint.pt").exists()

    resumed = run_trainer([*args, "--run-dir", str(stopped)])
    assert resumed.returncode == 0, resumed.stderr
    assert "Resumed from" in resumed.stdout
    expected, got = final_weights(straight), final_weights(stopped)
    # Same seed, same order of operations on CPU: bit-identical, no tolerance needed.
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert records(stopped, "summary")[0]["epochs_run"] == 4


def test_demo_without_real_data_generates_and_says_so(tmp_path):
    result = run_trainer(["--demo", "--data-dir", str(tmp_path / "no-data"), "--run-dir",
                          str(tmp_path / "demo"), "--limit-train", "256", "--limit-test", "64",
                          "--epochs", "1", "--batch-size", "64"])
    assert result.returncode == 0, result.stderr
    assert "generated CIFAR-format dataset" in result.stdout
    assert (tmp_path / "demo" / "synthetic-data" / "cifar-100-python" / "train").exists()
    assert "Training completed successfully." in result.stdout
    # The run record says so too, for ddp-bench report (make demo's last lines).
    assert records(tmp_path / "demo", "run")[0]["data_generated_in"] == str(tmp_path / "demo" / "synthetic-data")


def test_corrupt_checkpoint_is_a_one_line_error(ten_class_data, tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS])
    assert result.returncode == 2
    assert result.stderr.startswith("ddp-train: error: checkpoint ") and result.stderr.count("\n") == 1
    assert "corrupt or unreadable" in result.stderr
    assert (tmp_path / "checkpoint.pt").read_bytes() == b"not a checkpoint"  # nothing overwritten


def test_batch_not_divisible_by_world_size_fails_on_every_rank(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--batch-size", "33"], torchrun_nproc=2)
    assert result.returncode != 0
    assert "ddp-train: error: --batch-size 33 is not divisible by the world size 2" in result.stderr
    assert result.stderr.count("ddp-train: error:") == 1  # once for the job, not once per rank


def worker_pids(agent_pid: int) -> dict[int, int]:
    """RANK -> pid of torchrun's worker processes (children of the agent)."""
    children = Path(f"/proc/{agent_pid}/task/{agent_pid}/children").read_text().split()
    ranks = {}
    for pid in map(int, children):
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)
        if rank is not None:
            ranks[rank] = pid
    return ranks


def two_ranks_past_their_first_epoch(data: Path, run_dir: Path, epochs: int) -> subprocess.Popen:
    """torchrun with 2 gloo ranks checking for a stop at every step, once an epoch is recorded."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "ddp_train", "--data-dir", str(data), "--run-dir", str(run_dir),
           *TINY_ARGS, "--epochs", str(epochs), "--target-accuracy", "1.1", "--stop-check-every", "1"]
    proc = subprocess.Popen(cmd, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 600  # a hang's bound, not the behaviour: a starved run takes minutes
    while not (run_dir / "metrics.jsonl").exists() or not records(run_dir, "epoch"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_signal_to_one_rank_stops_every_rank_with_the_requeue_code(ten_class_data, tmp_path):
    proc = two_ranks_past_their_first_epoch(ten_class_data, tmp_path, epochs=20)
    ranks = worker_pids(proc.pid)
    assert sorted(ranks) == [0, 1]
    os.kill(ranks[1], signal.SIGUSR2)  # only rank 1 hears it; rank 0 must agree and save
    out, err = proc.communicate(timeout=60)
    stopped = records(tmp_path, "stopped")
    assert stopped and stopped[0]["signal"] == "SIGUSR2"  # rank 0 learns which signal
    assert stopped[0]["exit_code"] == EXIT_REQUEUE and (tmp_path / "checkpoint.pt").exists()
    assert len(records(tmp_path, "epoch")) < 20
    assert f"exitcode  : {EXIT_REQUEUE}" in err  # torchrun's report of the workers' exit


def test_a_stop_request_in_the_run_dir_stops_every_rank_like_the_signal(ten_class_data, tmp_path):
    # What a job script's trap for --signal=B:USR2@T writes: no process of the step is signalled.
    proc = two_ranks_past_their_first_epoch(ten_class_data, tmp_path, epochs=40)
    (tmp_path / ".ddp-stop-request").write_text("SIGUSR2\n")
    out, err = proc.communicate(timeout=90)
    assert f"exitcode  : {EXIT_REQUEUE}" in err, err  # torchrun's report: every worker exited 75
    stopped = records(tmp_path, "stopped")
    assert stopped and stopped[0]["signal"] == "SIGUSR2"
    assert len(records(tmp_path, "epoch")) < 40
    assert not (tmp_path / ".ddp-stop-request").exists()  # acted on: a restart by hand trains


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_surviving_rank_fails_instead_of_hanging_when_a_peer_dies(ten_class_data, tmp_path):
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = trainer_env(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [sys.executable, "-m", "ddp_train", "--data-dir", str(ten_class_data), "--run-dir",
               str(tmp_path), *TINY_ARGS, "--epochs", "50", "--target-accuracy", "1.1",
               "--dist-timeout-s", "30"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 600  # a hang's bound, not the behaviour: a starved run takes minutes
        while not (tmp_path / "metrics.jsonl").exists() or not records(tmp_path, "epoch"):
            assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
            time.sleep(0.05)
        procs[1].kill()
        started = time.monotonic()
        code = procs[0].wait(timeout=60)
        assert code != 0
        assert time.monotonic() - started < 45  # at most the process-group timeout, not forever
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
