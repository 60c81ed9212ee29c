"""Checkpoint decisions as pure functions: whether to resume, whether a checkpoint belongs to
this run, what a resume with a longer --epochs or another early-stop target reopens, which rank's
RNG state to restore (checkpoint.py, ddp_contract.same_run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_contract import same_run
from ddp_train.checkpoint import PlanChange, Progress, mismatch, reopen, rng_for_rank, wants_resume
from ddp_train.config import config_from_args


@pytest.mark.parametrize("requested,exists,expected", [
    (None, True, True),  # neither flag: a checkpoint there is resumed
    (None, False, False),  # neither flag, nothing there: a fresh start
    (True, False, True),  # --resume without a checkpoint: resume, which then names the missing file
    (False, True, False),  # --no-resume: fresh, the old run is moved aside (safety/rundir.py)
])
def test_resume_follows_the_flag_and_else_the_checkpoint(requested, exists, expected):
    assert wants_resume(requested, exists) is expected


def test_a_checkpoint_of_the_same_run_fits():
    config = config_from_args(["--epochs", "3", "--seed", "7"])
    assert mismatch(config.to_dict(), config, Path("runs/a/checkpoint.pt")) is None


@pytest.mark.parametrize("flag", same_run.FIXED_FLAGS)
def test_a_checkpoint_of_another_run_names_the_flag_and_the_ways_out(flag):
    config = config_from_args([])
    saved = {**config.to_dict(), flag: "something else"}

    message = mismatch(saved, config, Path("runs/a/checkpoint.pt"))

    assert message is not None
    assert f"--{flag.replace('_', '-')} something else" in message
    assert "another --run-dir" in message and "--no-resume" in message
    assert "runs/a/checkpoint-<UTC time>/" in message


def test_flags_that_do_not_change_the_run_may_differ_on_resume():
    config = config_from_args(["--checkpoint-every", "1"])
    saved = {**config.to_dict(), "checkpoint_every": 5, "data_dir": "elsewhere"}
    assert mismatch(saved, config, Path("checkpoint.pt")) is None


def test_a_resume_may_train_longer_but_never_shorter():
    saved = config_from_args(["--epochs", "50"]).to_dict()
    assert mismatch(saved, config_from_args(["--epochs", "80"]), Path("runs/a/checkpoint.pt")) is None
    assert mismatch(saved, config_from_args(["--epochs", "50"]), Path("runs/a/checkpoint.pt")) is None

    message = mismatch(saved, config_from_args(["--epochs", "30"]), Path("runs/a/checkpoint.pt"))

    assert message is not None and message.startswith("runs/a/checkpoint.pt is a run of --epochs 50, this run has 30")
    assert "pass --epochs 50 or more" in message and "--no-resume" in message


def ended(epoch: int, accuracies: list, early: bool) -> Progress:
    return Progress(epoch=epoch, accuracies=accuracies, early_stopped=early, finished=True)


def test_a_run_that_ended_at_its_last_epoch_trains_on_to_a_longer_epochs():
    progress = ended(50, [0.5] * 50, early=False)
    change = reopen(progress, 50, config_from_args(["--epochs", "80"]))
    assert change == PlanChange(50, 80, 50, 0, early_stop_lifted=False)
    assert not progress.finished


def test_the_same_epochs_reopen_nothing():
    progress = ended(50, [0.5] * 50, early=False)
    assert reopen(progress, 50, config_from_args(["--epochs", "50"])) is None and progress.finished


def test_a_run_stopped_mid_way_keeps_its_place_under_a_longer_plan():
    progress = Progress(epoch=20, step=7, accuracies=[0.3] * 20)
    assert reopen(progress, 50, config_from_args(["--epochs", "80"])) == PlanChange(50, 80, 20, 7, False)
    assert not progress.finished


def test_an_early_stop_holds_while_its_target_is_still_reached():
    # Stopped early at epoch 30 of 50, its last 2 epochs at 0.86: --epochs 80 alone changes nothing
    # the early stop judged, so the run stays ended (the trainer says a higher target trains on).
    progress = ended(30, [0.5] * 28 + [0.86, 0.86], early=True)
    config = config_from_args(["--epochs", "80", "--target-accuracy", "0.85", "--patience", "2"])
    assert reopen(progress, 50, config) is None
    assert progress.finished and progress.early_stopped


@pytest.mark.parametrize("flags", [["--target-accuracy", "0.9"], ["--patience", "3", "--target-accuracy", "0.86"]])
def test_an_early_stop_is_lifted_where_this_starts_target_is_not_reached(flags):
    progress = ended(30, [0.5] * 28 + [0.86, 0.86], early=True)
    change = reopen(progress, 50, config_from_args(["--epochs", "50", *flags]))
    assert change == PlanChange(50, 50, 30, 0, early_stop_lifted=True)
    assert not progress.finished and not progress.early_stopped


def test_each_rank_restores_its_own_rng_state():
    saved = ["rank0", "rank1", "rank2"]
    assert [rng_for_rank(saved, rank, 3) for rank in range(3)] == saved


def test_a_new_world_size_restores_no_rng_state():
    # The ranks of a 2-process checkpoint do not map onto 4 processes (or 1): start them fresh.
    assert rng_for_rank(["rank0", "rank1"], 0, 4) is None
    assert rng_for_rank(["rank0", "rank1"], 0, 1) is None
