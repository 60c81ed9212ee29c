"""SIGTERM at any point of a run (a launcher dying sends it, via PR_SET_PDEATHSIG) ends it with a
checkpoint and exit 75, never a traceback."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from ddp_train import checkpoint, cli, train
from ddp_train.recipe import data
from ddp_train.errors import EXIT_REQUEUE

TINY = ["--allow-unverified-data", "--batch-size", "32", "--width-scale", "0.0625", "--device", "cpu",
        "--no-tta", "--epochs", "3", "--checkpoint-every", "1", "--target-accuracy", "1"]


@pytest.fixture(autouse=True)
def _world_of_one(world_of_one):
    """In-process runs: a world of one (conftest.world_of_one)."""


def terminated_during(module, name: str, monkeypatch) -> None:
    """SIGTERM to this process as `module.name` is first called (the real function then runs)."""
    real, sent = getattr(module, name), []

    def with_sigterm(*args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, with_sigterm)


@pytest.mark.parametrize("module,name", [
    (data, "load_cifar100"),  # data loading, before the first step
    (data, "random_crop_flip"),  # the first step
    (train, "evaluate"),  # evaluation at the end of epoch 1
    (checkpoint, "save_atomic"),  # the checkpoint after epoch 1
], ids=["data loading", "first step", "evaluation", "checkpoint save"])
def test_sigterm_ends_the_run_with_a_checkpoint_and_exit_75(module, name, data_dir, tmp_path, capsys,
                                                             monkeypatch):
    terminated_during(module, name, monkeypatch)

    code = cli.main(["--data-dir", str(data_dir), "--run-dir", str(tmp_path), *TINY])

    captured = capsys.readouterr()
    assert code == EXIT_REQUEUE, captured.err
    assert "Traceback" not in captured.err
    assert "Stop requested (SIGTERM): checkpoint saved" in captured.out
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert not state["progress"]["finished"] and state["progress"]["epoch"] < 3
