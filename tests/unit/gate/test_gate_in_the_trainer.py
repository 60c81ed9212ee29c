"""`ddp-train --fabric-gate`: the fabric gate in the trainer's own ranks, on the training's process group
before anything else (gate/run.py, on_the_training_group), as the job scripts run it for the built-in
trainer. A node it names ends every rank with 76 (ddp_contract.EXIT_BAD_NODE), for the job script's
quarantine, spare or requeue, before the data is read or a step is trained. Its passing side, with the
training after it: tests/unit/train/test_recovery.py and the e2e jobs."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

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
