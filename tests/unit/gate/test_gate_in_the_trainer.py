"""`ddp-train --fabric-gate`: the fabric gate in the trainer's own ranks, on the training's process group
before anything else (gate/run.py, on_the_training_group), as the job scripts run it for the built-in
trainer. A node it names ends every rank with 76 (ddp_contract.EXIT_BAD_NODE), for the job script's
quarantine, spare or requeue, before the data is read or a step is trained; a collective of the gate that
hangs fails within the gate's bound, not the training's timeout. Its passing side, with the training
after it: tests/unit/train/test_recovery.py and the e2e jobs."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from ddp_train.gate import run
from test_gate_without_subgroups import free_port, rank_env

# One rank of the real trainer (ddp-train's main), on a node named by FAKE_HOST.
TRAINER_RANK = textwrap.dedent("""
    import os, socket, sys
    socket.gethostname = lambda: os.environ["FAKE_HOST"]
    from ddp_train.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_node_the_trainers_gate_names_ends_every_rank_with_76_before_the_data_or_a_step(tmp_path):
    run_dir, port = tmp_path / "run", free_port()
    # No data dir at all: the gate comes first, so a bad node costs no more than the gate.
    argv = ["--fabric-gate", "--site", "olivia", "--device", "cpu", "--run-dir", str(run_dir),
            "--data-dir", str(tmp_path / "never-read")]
    ranks = [subprocess.Popen([sys.executable, "-c", TRAINER_RANK, *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=rank_env(rank, port, DDP_GATE_TEST_CORRUPT="n2:0:7", PYTHONUNBUFFERED="1"))
             for rank in (0, 1)]
    said = [rank.communicate(timeout=180) for rank in ranks]

    assert [rank.returncode for rank in ranks] == [76, 76], said
    report = json.loads((run_dir / "gate.json").read_text())
    assert report["bad_nodes"] == ["n2"] and [f["kind"] for f in report["faults"]] == ["corrupt"]
    assert report["world"]["sizes"][0]["wrong"] == 7
    assert "fabric gate: FAIL in " in said[0][0] and "node n2: " in said[0][0]
    assert "Traceback" not in said[0][1] + said[1][1]
    # Nothing trained, nothing written but the gate's report: no metrics, no checkpoint, no manifest.
    assert sorted(path.name for path in run_dir.iterdir()) == ["gate.json", "gate.txt"]


# A rank that never joins the gate's first all-reduce (its process alive: the fabric, not a lost node).
SILENT_RANK = textwrap.dedent("""
    import os, socket, sys, time
    socket.gethostname = lambda: os.environ["FAKE_HOST"]
    from ddp_train.gate import run
    run.GATE_TIMEOUT_S = 3.0
    if os.environ["RANK"] == "1":
        def silent(self, *args, **kwargs):
            time.sleep(float(os.environ["SILENT_S"]))
            os._exit(9)
        run.Runner.measure = silent
    from ddp_train.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_hang_at_the_trainers_gate_fails_within_the_gates_bound_not_the_trainings_timeout(tmp_path):
    # The training's --dist-timeout-s is 600 s; the gate's collectives are bounded by GATE_TIMEOUT_S (3 s
    # here), as the gate's own step's --timeout bounds them.
    port = free_port()
    argv = ["--fabric-gate", "--device", "cpu", "--run-dir", str(tmp_path / "run"), "--data-dir",
            str(tmp_path / "never-read"), "--dist-timeout-s", "600"]
    ranks = [subprocess.Popen([sys.executable, "-c", SILENT_RANK, *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=rank_env(rank, port, SILENT_S="300", PYTHONUNBUFFERED="1")) for rank in (0, 1)]
    started = time.monotonic()
    out, err = ranks[0].communicate(timeout=300)
    waited = time.monotonic() - started
    ranks[1].kill()
    ranks[1].communicate()

    # gloo's own words for the bound it ran under, then the trainer's roll call (15 s) names the silent rank:
    # about 26 s here with the imports; far under the training's 600 s however loaded the machine is.
    assert ranks[0].returncode == 1 and waited < 240, (waited, err[-3000:])
    assert "Timed out waiting 3000ms" in err and "ddp-train: error: lost contact with n2 (rank 1)" in err, err[-3000:]
    # Before any epoch: the line promises no checkpoint to resume from.
    assert "No checkpoint was written yet: resubmit or requeue the job to start it again" in err, err[-3000:]
    assert "is kept" not in err
    assert not (tmp_path / "run" / "gate.json").exists()  # no verdict: nothing measured


def test_the_training_gets_its_own_timeout_back_after_a_gate_that_ended_well_and_not_after_one_that_failed(monkeypatch):
    calls = []
    monkeypatch.setattr(run.dist, "set_timeout", lambda timeout, group=None: calls.append(timeout.total_seconds()),
                        raising=False)
    monkeypatch.setattr(run.distributed, "active", lambda: True)
    with run.collectives_bounded(120.0, 600.0):
        assert calls == [120.0]
    assert calls == [120.0, 600.0]
    calls.clear()
    with pytest.raises(RuntimeError), run.collectives_bounded(120.0, 600.0):
        raise RuntimeError("Timed out waiting 120000ms")  # the group is the roll call's now
    assert calls == [120.0]
    calls.clear()
    with run.collectives_bounded(120.0, 30.0):  # a training's timeout under the gate's: left as it is
        pass
    assert calls == []
