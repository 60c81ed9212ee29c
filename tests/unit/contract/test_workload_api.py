"""ddp_contract.workload: what a user's own script is told, and the few calls that let it take part (a stop
agreed by every rank, the heartbeat the agent's watchdog reads, the roll call after a lost node), with no
torch at import."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddp_contract import roll_call
from ddp_contract import workload as ddp

REPO = Path(__file__).resolve().parents[3]


def run_python(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DDP_", "RANK", "TORCHELASTIC_"))}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**clean, **env}, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def test_the_contract_imports_and_answers_without_torch(tmp_path):
    done = run_python("""
        import sys
        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is not here")
        sys.meta_path.insert(0, NoTorch())
        from ddp_contract import workload as ddp
        print(ddp.run_dir(), ddp.data_dir(), ddp.resuming(), ddp.stop_requested(), ddp.EXIT_REQUEUE, ddp.EXIT_BAD_NODE)
        """, tmp_path, DDP_RUN_DIR="/r", DDP_RESUME="1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["/r", "None", "True", "None", "75", "76"]


def test_resuming_is_a_requeue_a_spares_replacement_or_a_torchrun_restart():
    assert not ddp.resuming({}) and not ddp.resuming({"DDP_RESUME": "0", "TORCHELASTIC_RESTART_COUNT": "0"})
    assert ddp.resuming({"DDP_RESUME": "1"}) and ddp.resuming({"TORCHELASTIC_RESTART_COUNT": "2"})


STOPS = """
    import os, signal, sys
    from ddp_contract import workload as ddp
    print(ddp.stop_requested())
    if sys.argv[1:] == ["signal"]:
        os.kill(os.getpid(), signal.SIGTERM)   # the handler is in place after the first call: no death
    print(ddp.stop_requested())
    """


def test_rank_0_takes_the_stop_request_file_and_removes_it_the_other_ranks_only_signals(tmp_path):
    request = tmp_path / ".ddp-stop-request"
    request.write_text("SIGUSR2\n")
    done = run_python(STOPS, tmp_path, RANK="0", DDP_STOP_REQUEST=str(request))
    assert (done.returncode, done.stdout.split()) == (0, ["SIGUSR2", "SIGUSR2"]), done.stderr
    assert not request.exists()  # acted on: a run started again by hand does not stop at once
    request.write_text("USR1\n")
    other = run_python(STOPS, tmp_path, RANK="1", DDP_STOP_REQUEST=str(request))
    assert other.stdout.split() == ["None", "None"] and request.exists()


def test_term_after_the_first_call_is_a_stop_request_as_for_the_trainer(tmp_path):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(STOPS), "signal"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.split()) == (0, ["None", "SIGTERM"]), done.stderr


def test_the_stop_request_names_its_signal_and_an_unknown_one_is_usr2():
    assert ddp.stop_signal_named("USR1\n") == signal.SIGUSR1
    assert ddp.stop_signal_named("SIGTERM") == signal.SIGTERM
    assert ddp.stop_signal_named("whatever") == signal.SIGUSR2


def test_progress_is_the_heartbeat_the_nodes_watchdog_reads(tmp_path):
    beats = tmp_path / "beats"
    beats.mkdir()
    done = run_python("""
        from ddp_contract import workload as ddp
        ddp.progress(7)
        ddp.progress(8)
        ddp.finish()
        """, tmp_path, RANK="3", LOCAL_RANK="1", DDP_HEARTBEAT_DIR=str(beats), DDP_RUN_DIR=str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    from ddp_launch.watchdog import Watchdog
    (beat,) = Watchdog(str(beats)).read()
    assert (beat.rank, beat.step, beat.run_dir) == (3, 8, str(tmp_path / "run"))
    assert beat.stall_after_s == 300.0  # half the collective timeout: 600 s where no process group says its own


def test_a_lost_node_after_progress_is_named_once_and_reported_for_the_job_script(tmp_path, monkeypatch, capsys):
    import torch.distributed as dist
    store = dist.HashStore()
    store.set("ddp-train/roll-call/0", "1")  # rank 0 on node1 answered; node2's ranks never do
    monkeypatch.setattr(roll_call, "default_store", lambda: store)
    monkeypatch.setattr(roll_call, "ROLL_CALL_S", 0.2)
    monkeypatch.setattr(ddp._taking, "hosts", ["node1", "node1", "node2", "node2"])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("DDP_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("MASTER_ADDR", "node1")

    assert ddp.after_failure(RuntimeError("Connection closed by peer")) is True

    said = capsys.readouterr().err
    assert said.startswith("ddp-launch: error: lost contact with node2 (ranks 2, 3): no answer 0 s after a "
                           "collective failed (Connection closed by peer)")
    assert f"The last checkpoint (in {tmp_path}) is kept" in said and said.count("\n") == 1
    assert json.loads((tmp_path / "roll-call.json").read_text())["lost"] == [{"node": "node2", "ranks": [2, 3]}]


def test_a_failure_before_progress_or_with_every_rank_answering_is_no_lost_node(monkeypatch):
    monkeypatch.setattr(ddp._taking, "hosts", None)
    assert ddp.after_failure(RuntimeError("boom")) is None
