"""A run resumed with a longer --epochs trains on from its checkpoint: its steps, its learning-rate
schedule and its early stop follow ddp_contract.same_run's rules, and its metrics record them.

Real runs of the trainer in this process (cli.main, a world of one) on 64 generated images: 2 steps
of 32 an epoch, a warm-up of one epoch (2 steps), cosine decay.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_contract import same_run
from ddp_train import cli
from ddp_train.metrics import read_metrics
from ddp_train.recipe.learner import lr_at
from train_helpers import LAUNCH_VARIABLES

ARGS = ["--allow-unverified-data", "--batch-size", "32", "--width-scale", "0.0625", "--device", "cpu",
        "--schedule", "cosine", "--warmup-epochs", "1", "--target-accuracy", "1.1"]
STEPS_PER_EPOCH, WARMUP_STEPS = 2, 2


def train(data_dir: Path, run_dir: Path, *flags: str) -> int:
    return cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *ARGS, *flags])


def records(run_dir: Path, record_type: str) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["type"] == record_type]


@pytest.fixture(scope="module")
def extended(data_dir, tmp_path_factory):
    """A run of --epochs 2 to its end, then the same command with --epochs 4: the run dir."""
    run_dir = tmp_path_factory.mktemp("extended") / "run"
    with pytest.MonkeyPatch.context() as patch:
        for name in LAUNCH_VARIABLES:  # a world of one (conftest.world_of_one, for the module)
            patch.delenv(name, raising=False)
        for epochs in ("2", "4"):
            assert train(data_dir, run_dir, "--epochs", epochs) == 0
    return run_dir


def test_a_longer_epochs_continues_the_finished_run_to_the_new_end(extended):
    epochs = records(extended, "epoch")
    # Epochs 1-2 of the first start, 3-4 of the second: none trained twice, each its 2 steps of 32.
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4]
    assert [r["images"] for r in epochs] == [64] * 4
    summaries = records(extended, "summary")
    assert [s["epochs_run"] for s in summaries] == [2, 4]
    saved = torch.load(extended / "checkpoint.pt", weights_only=True)
    assert saved["progress"]["epoch"] == 4 and saved["progress"]["finished"] and saved["config"]["epochs"] == 4
    runs = records(extended, "run")
    assert [r["resumed_from_epoch"] for r in runs] == [None, 2]


def test_the_learning_rate_follows_the_longer_runs_schedule_from_the_step_reached(extended):
    peak = records(extended, "run")[0]["lr"]
    record = records(extended, "extended")[0]
    total = STEPS_PER_EPOCH * 4
    # At step 4 the 2-epoch plan had decayed to 0; the 4-epoch plan is a third into its 6 steps of decay,
    # where cosine stands at (1 + cos(pi / 3)) / 2 = 0.75 of the peak.
    assert record["epochs_from"] == 2 and record["epochs_to"] == 4
    assert (record["at_epoch"], record["at_step"], record["global_step"]) == (2, 0, 4)
    assert record["lr_before"] == pytest.approx(0.0, abs=1e-12)
    assert record["lr_after"] == pytest.approx(lr_at(4, total, WARMUP_STEPS, peak, "cosine"))
    assert record["lr_after"] == pytest.approx(peak * 0.75)
    assert record["lr_rule"] == same_run.LR_RULE and record["early_stop_rule"] == same_run.EARLY_STOP_RULE
    # Each epoch record holds its last step's LR: epochs 3 and 4 on the 4-epoch plan (steps 5 and 7),
    # epochs 1 and 2 on the 2-epoch plan they were trained under (steps 1 and 3).
    lrs = [r["lr"] for r in records(extended, "epoch")]
    assert lrs[2:] == pytest.approx([lr_at(step, total, WARMUP_STEPS, peak, "cosine") for step in (5, 7)])
    assert lrs[:2] == pytest.approx([lr_at(step, 4, WARMUP_STEPS, peak, "cosine") for step in (1, 3)])
    # The record comes right after the second start's run record.
    types = [r["type"] for r in read_metrics(extended / "metrics.jsonl")]
    assert types[types.index("run", 1) + 1] == "extended"


def test_the_checkpoints_summary_holds_the_new_plan_for_checks_without_torch(extended):
    summary = json.loads((extended / same_run.SUMMARY_NAME).read_text())
    assert summary["config"]["epochs"] == 4 and summary["epoch"] == 4 and summary["finished"] is True
    assert summary["config"]["width_scale"] == 0.0625 and summary["config"]["batch_size"] == 32


@pytest.mark.parametrize("flags, code, said", [
    (["--epochs", "9"], 0, ""),
    (["--epochs=4"], 0, ""),
    (["--epochs", "3"], 2, "is a run of --epochs 4, this run has 3"),
    (["--width-scale", "0.125", "--epochs", "9"], 2, "was written with --width-scale 0.0625, this run has 0.125"),
    (["--batch-size=64"], 2, "was written with --batch-size 32, this run has 64"),
])
def test_the_check_without_torch_judges_the_flags_given_as_the_trainer_does(extended, flags, code, said):
    done = subprocess.run([sys.executable, "-m", "ddp_contract", "resume-check", str(extended), "--", *flags],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    if said:
        assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr


def test_a_shorter_epochs_is_refused_in_one_line_and_the_run_is_untouched(extended, data_dir, world_of_one, capsys):
    before = (extended / "checkpoint.pt").read_bytes()
    assert train(data_dir, extended, "--epochs", "3") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a run of --epochs 4, this run has 3" in err
    assert "pass --epochs 4 or more" in err
    assert (extended / "checkpoint.pt").read_bytes() == before


def test_an_early_stop_holds_until_this_starts_target_is_not_reached(data_dir, tmp_path, world_of_one, capsys):
    run_dir = tmp_path / "run"
    early = ["--target-accuracy", "0", "--patience", "1"]  # reached by the first epoch
    assert train(data_dir, run_dir, "--epochs", "2", *early) == 0
    assert len(records(run_dir, "epoch")) == 1 and records(run_dir, "summary")[0]["early_stopped"]
    capsys.readouterr()

    # More epochs, the same target: the early stop still holds, nothing trains, and the way on is said.
    assert train(data_dir, run_dir, "--epochs", "3", *early) == 0
    out = capsys.readouterr().out
    assert "stopped early at its target" in out and "a higher --target-accuracy trains on" in out
    assert len(records(run_dir, "epoch")) == 1

    # A target the last epoch does not reach lifts it: epochs 2 and 3 train.
    assert train(data_dir, run_dir, "--epochs", "3", "--target-accuracy", "1.1") == 0
    assert [r["epoch"] for r in records(run_dir, "epoch")] == [1, 2, 3]
    lifted = records(run_dir, "extended")[-1]
    assert lifted["early_stop_lifted"] is True and (lifted["epochs_from"], lifted["epochs_to"]) == (2, 3)
    assert not records(run_dir, "summary")[-1]["early_stopped"]
