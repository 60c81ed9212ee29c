"""Resuming needs a matching checkpoint; a mismatch is one clear line, not a shape error."""

import pytest

from ddp_train import cli
from ddp_train.synthetic import write_dataset

ARGS = ["--allow-unverified-data", "--batch-size", "32", "--epochs", "1", "--width-scale", "0.0625"]


@pytest.fixture()
def small_data(tmp_path):
    write_dataset(tmp_path / "data", train=64, test=16, seed=2)
    return tmp_path / "data"


def test_explicit_resume_without_a_checkpoint_is_an_error(small_data, tmp_path, capsys):
    code = cli.main(["--data-dir", str(small_data), "--run-dir", str(tmp_path / "run"), "--resume", *ARGS])
    assert code == 2
    assert "--resume but there is no checkpoint" in capsys.readouterr().err


def test_resume_with_another_width_names_the_flag(small_data, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert cli.main(["--data-dir", str(small_data), "--run-dir", run_dir, *ARGS]) == 0
    capsys.readouterr()
    code = cli.main(["--data-dir", str(small_data), "--run-dir", run_dir, *ARGS, "--width-scale", "0.125"])
    err = capsys.readouterr().err
    assert code == 2 and "--width-scale 0.0625" in err and err.count("\n") == 1


def test_rerunning_a_finished_run_trains_nothing_and_reports_again(small_data, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert cli.main(["--data-dir", str(small_data), "--run-dir", run_dir, *ARGS]) == 0
    capsys.readouterr()
    assert cli.main(["--data-dir", str(small_data), "--run-dir", run_dir, *ARGS]) == 0
    out = capsys.readouterr().out
    assert "nothing left to train" in out and "Epoch 1/1" not in out
    assert "Training completed successfully." in out
