"""Checkpoint decisions as pure functions: whether to resume, whether a checkpoint belongs to
this run, which rank's RNG state to restore (checkpoint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddp_train.checkpoint import SAME_RUN_FLAGS, mismatch, rng_for_rank, wants_resume
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


@pytest.mark.parametrize("flag", SAME_RUN_FLAGS)
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


def test_each_rank_restores_its_own_rng_state():
    saved = ["rank0", "rank1", "rank2"]
    assert [rng_for_rank(saved, rank, 3) for rank in range(3)] == saved


def test_a_new_world_size_restores_no_rng_state():
    # The ranks of a 2-process checkpoint do not map onto 4 processes (or 1): start them fresh.
    assert rng_for_rank(["rank0", "rank1"], 0, 4) is None
    assert rng_for_rank(["rank0", "rank1"], 0, 1) is None
