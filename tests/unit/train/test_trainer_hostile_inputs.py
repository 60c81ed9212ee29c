"""Bad input, as a hostile user types it, gets one line `ddp-train: error: ...`, exit 2, no traceback.

Every case runs the real entry point, ddp_train.cli.main, in-process, and must fail before any
training starts: NaN, infinite, negative and huge numbers for the numeric
flags, abbreviated and unknown flags, empty and odd paths, a data dir or run dir that is a
file, truncated and corrupt dataset and checkpoint files, and broken launch variables.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_train import cli
from train_helpers import trainer_env

TINY = ["--allow-unverified-data", "--batch-size", "32", "--epochs", "1", "--width-scale", "0.0625",
        "--device", "cpu"]

# Flags whose values parse but cannot work (or crashed inside torch before the trainer checked them).
BAD_FLAGS = {
    "width-scale nan": ["--width-scale", "nan"],
    "width-scale inf": ["--width-scale", "inf"],
    "width-scale -inf": ["--width-scale", "-inf"],
    "width-scale 0": ["--width-scale", "0"],
    "width-scale negative": ["--width-scale", "-1"],
    "width-scale huge": ["--width-scale", "1e9"],
    "momentum 0 with the recipe's nesterov": ["--momentum", "0"],
    "momentum 0 with explicit nesterov": ["--momentum", "0", "--nesterov", "--recipe", "guide"],
    "momentum nan": ["--momentum", "nan"],
    "momentum negative": ["--momentum", "-0.5", "--no-nesterov"],
    "momentum over 1": ["--momentum", "1.5"],
    "weight-decay -1": ["--weight-decay", "-1"],
    "weight-decay nan": ["--weight-decay", "nan"],
    "weight-decay inf": ["--weight-decay", "inf"],
    "seed over 2^63": ["--seed", str(2**63 + 1)],
    "seed over 2^64": ["--seed", str(2**64)],
    "seed negative": ["--seed", "-1"],
    "seed not a number": ["--seed", "lucky"],
    "base-lr nan": ["--base-lr", "nan"],
    "base-lr inf": ["--base-lr", "inf"],
    "base-lr 0": ["--base-lr", "0"],
    "base-lr negative": ["--base-lr", "-0.1"],
    "dropout nan": ["--dropout", "nan"],
    "dropout 1": ["--dropout", "1"],
    "label-smoothing over 1": ["--label-smoothing", "1.5"],
    "ema-decay 1": ["--ema-decay", "1"],
    "ema-decay nan": ["--ema-decay", "nan"],
    "warmup-epochs negative": ["--warmup-epochs", "-1"],
    "warmup-epochs nan": ["--warmup-epochs", "nan"],
    "target-accuracy nan": ["--target-accuracy", "nan"],
    "target-accuracy negative": ["--target-accuracy", "-1"],
    "dist-timeout-s inf": ["--dist-timeout-s", "inf"],
    "dist-timeout-s 0": ["--dist-timeout-s", "0"],
    "dist-timeout-s 1e30": ["--dist-timeout-s", "1e30"],
    "bucket-cap-mb nan": ["--bucket-cap-mb", "nan"],
    "bucket-cap-mb 0": ["--bucket-cap-mb", "0"],
    "batch-size 0": ["--batch-size", "0"],
    "batch-size negative": ["--batch-size", "-32"],
    "batch-size 1e20": ["--batch-size", str(10**20)],
    "batch-size float": ["--batch-size", "32.5"],
    "epochs 0": ["--epochs", "0"],
    "epochs negative": ["--epochs", "-1"],
    "epochs empty": ["--epochs", ""],
    "patience 0": ["--patience", "0"],
    "eval-batch-size 0": ["--eval-batch-size", "0"],
    "stop-check-every 0": ["--stop-check-every", "0"],
    "checkpoint-every negative": ["--checkpoint-every", "-1"],
    "limit-train negative": ["--limit-train", "-1"],
    "limit-test negative": ["--limit-test", "-5"],
    "abbreviated --epoch": ["--epoch", "2"],
    "abbreviated --width": ["--width", "0.5"],
    "abbreviated --no-res": ["--no-res"],
    "unknown flag": ["--frobnicate"],
    "unknown precision": ["--precision", "fp8"],
    "unknown recipe": ["--recipe", "secret"],
    "stray positional": ["train.py"],
}


@pytest.fixture(autouse=True)
def _world_of_one(world_of_one):
    """In-process runs: a world of one (conftest.world_of_one)."""


def assert_one_line_usage_error(code: int, captured, prog: str = "ddp-train") -> str:
    assert code == 2, captured.err
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), captured.err
    assert "Epoch 1/" not in captured.out  # found before training started
    return lines[0]


@pytest.mark.parametrize("flags", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_a_bad_flag_is_one_line_before_training(flags, data_dir, tmp_path, capsys):
    code = cli.main(args(data_dir, tmp_path / "run", *flags))
    assert_one_line_usage_error(code, capsys.readouterr())


def test_the_error_names_the_flag_and_a_fix(data_dir, tmp_path, capsys):
    cli.main(["--data-dir", str(data_dir), "--run-dir", str(tmp_path / "run"), *TINY, "--momentum", "0"])
    assert "--no-nesterov" in capsys.readouterr().err
    cli.main(["--data-dir", str(data_dir), "--run-dir", str(tmp_path / "run"), *TINY, "--width-scale", "nan"])
    assert "--width-scale nan must be a finite number" in capsys.readouterr().err


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


def _newline_file(tmp_path: Path) -> Path:
    path = tmp_path / "two\nlines"
    path.write_text("a file whose name holds a newline")
    return path


def _dataset_with(tmp_path: Path, data_dir: Path, damage) -> Path:
    copy = tmp_path / "damaged"
    (copy / "cifar-100-python").mkdir(parents=True)
    for name in ("train", "test", "meta"):
        source = data_dir / "cifar-100-python" / name
        (copy / "cifar-100-python" / name).write_bytes(source.read_bytes())
    damage(copy / "cifar-100-python" / "train")
    return copy


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:3000])


def _garble(path: Path) -> None:
    path.write_bytes(os.urandom(5000))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _into_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def args(data_dir, run_dir, *extra: str, verified: bool = False) -> list[str]:
    tiny = [flag for flag in TINY if flag != "--allow-unverified-data"] if verified else TINY
    return ["--data-dir", str(data_dir), "--run-dir", str(run_dir), *tiny, *extra]


# name -> function of (tmp_path, data_dir) -> the command line
BAD_PATHS = {
    "run dir is a file": lambda t, d: args(d, _file(t)),
    "run dir below a file": lambda t, d: args(d, _file(t) / "run"),
    "run dir is a file, with a compile cache in it": lambda t, d: args(d, _file(t), "--compile"),
    "run dir named with a newline is a file": lambda t, d: args(d, _newline_file(t)),
    "run dir empty": lambda t, d: args(d, ""),
    "data dir empty": lambda t, d: args("", t / "run"),
    "data dir blank": lambda t, d: args("  ", t / "run"),
    "data dir is a file": lambda t, d: args(_file(t), t / "run"),
    "data dir missing": lambda t, d: args(t / "nowhere", t / "run"),
    "data dir with non-UTF-8 bytes": lambda t, d: args(os.fsdecode(bytes(t) + b"/\xff\xfe"), t / "run"),
    "truncated train file": lambda t, d: args(_dataset_with(t, d, _truncate), t / "run"),
    "garbage train file": lambda t, d: args(_dataset_with(t, d, _garble), t / "run"),
    "empty train file": lambda t, d: args(_dataset_with(t, d, _empty), t / "run"),
    "train file is a directory": lambda t, d: args(_dataset_with(t, d, _into_directory), t / "run"),
    "generated data without --allow-unverified-data": lambda t, d: args(d, t / "run", verified=True),
}


@pytest.mark.parametrize("make_args", BAD_PATHS.values(), ids=BAD_PATHS.keys())
def test_a_bad_path_or_dataset_is_one_line_before_training(make_args, data_dir, tmp_path, capsys):
    code = cli.main(make_args(tmp_path, data_dir))
    assert_one_line_usage_error(code, capsys.readouterr())


def _write_checkpoint(run_dir: Path, content) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "checkpoint.pt"
    if callable(content):
        content(path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)


def _directory(path: Path) -> None:
    path.mkdir()


SAVED_CONFIG = {"width_scale": 0.0625, "batch_size": 32, "epochs": 1, "seed": 0, "recipe": "improved"}
BAD_CHECKPOINTS = {
    "0-byte (a full disk)": b"",
    "cut off": b"PK\x03\x04 half a zip",
    "random bytes": bytes(range(256)) * 8,
    "not a dict": [1, 2, 3],
    "a dict without the run's keys": {"weights": torch.zeros(1)},
    "keys present, nothing fits": {"model": {"bogus": torch.zeros(1)}, "optimizer": {}, "scaler": {},
                                   "progress": {"epoch": "x"}, "rng": [], "config": SAVED_CONFIG},
    "another width": {"model": {}, "optimizer": {}, "scaler": {}, "progress": {}, "rng": [],
                      "config": {**SAVED_CONFIG, "width_scale": 1.0}},
    "a directory": _directory,
}


@pytest.mark.parametrize("content", BAD_CHECKPOINTS.values(), ids=BAD_CHECKPOINTS.keys())
def test_a_bad_checkpoint_is_one_line_and_left_in_place(content, data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    _write_checkpoint(run_dir, content)
    before = sorted(p.name for p in run_dir.iterdir())
    code = cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY])
    line = assert_one_line_usage_error(code, capsys.readouterr())
    assert "checkpoint" in line and "--no-resume" in line  # the way forward
    assert sorted(p.name for p in run_dir.iterdir()) == before  # nothing moved or overwritten


def test_a_zero_byte_checkpoint_points_at_the_previous_one(data_dir, tmp_path, capsys):
    run_dir = tmp_path / "run"
    _write_checkpoint(run_dir, b"")
    (run_dir / "checkpoint.prev.pt").write_bytes(b"an older checkpoint")
    cli.main(["--data-dir", str(data_dir), "--run-dir", str(run_dir), *TINY])
    line = capsys.readouterr().err
    assert "is empty (0 bytes" in line
    assert f"`mv {run_dir}/checkpoint.prev.pt {run_dir}/checkpoint.pt`" in line


def test_resume_without_a_checkpoint_is_one_line(data_dir, tmp_path, capsys):
    code = cli.main(["--data-dir", str(data_dir), "--run-dir", str(tmp_path / "run"), *TINY, "--resume"])
    assert_one_line_usage_error(code, capsys.readouterr())


# Launch variables a world of one still reads (a world of several is tested in a subprocess below).
BAD_ENVIRONMENTS = {
    "WORLD_SIZE=abc": {"WORLD_SIZE": "abc", "RANK": "0"},
    "WORLD_SIZE=abc alone": {"WORLD_SIZE": "abc"},
    "WORLD_SIZE=0": {"WORLD_SIZE": "0", "RANK": "0"},
    "WORLD_SIZE empty": {"WORLD_SIZE": "", "RANK": "0"},
    "RANK=abc": {"WORLD_SIZE": "1", "RANK": "abc"},
    "RANK=-1": {"WORLD_SIZE": "1", "RANK": "-1"},
    "RANK without WORLD_SIZE": {"RANK": "0"},
    "LOCAL_RANK=x": {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "x"},
    "LOCAL_WORLD_SIZE=0": {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_WORLD_SIZE": "0"},
}


@pytest.mark.parametrize("env", BAD_ENVIRONMENTS.values(), ids=BAD_ENVIRONMENTS.keys())
def test_a_broken_launch_variable_is_one_line(env, data_dir, tmp_path, capsys, monkeypatch):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = cli.main(["--data-dir", str(data_dir), "--run-dir", str(tmp_path / "run"), *TINY])
    assert_one_line_usage_error(code, capsys.readouterr())


def test_download_into_a_file_or_with_a_garbled_world_size_is_one_line(tmp_path, capsys, monkeypatch):
    # Neither reaches the network: both are refused before the fetch.
    code = cli.main(["--download", "--data-dir", str(_file(tmp_path))])
    assert_one_line_usage_error(code, capsys.readouterr())
    monkeypatch.setenv("WORLD_SIZE", "abc")
    code = cli.main(["--download", "--data-dir", str(tmp_path / "data")])
    assert_one_line_usage_error(code, capsys.readouterr())


WORLD_OF_TWO = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
BAD_WORLDS = {
    "RANK beyond the world": {**WORLD_OF_TWO, "RANK": "7", "LOCAL_RANK": "0"},
    "no MASTER_ADDR": {**{k: v for k, v in WORLD_OF_TWO.items() if k != "MASTER_ADDR"},
                       "RANK": "0", "LOCAL_RANK": "0"},
    "MASTER_PORT out of range": {**WORLD_OF_TWO, "MASTER_PORT": "99999", "RANK": "0", "LOCAL_RANK": "0"},
    "MASTER_PORT not a number": {**WORLD_OF_TWO, "MASTER_PORT": "http", "RANK": "0", "LOCAL_RANK": "0"},
}


@pytest.mark.parametrize("env", BAD_WORLDS.values(), ids=BAD_WORLDS.keys())
def test_a_broken_world_of_several_is_one_line_in_a_real_process(env, data_dir, tmp_path):
    # A process of a world of several leaves through os._exit (exit_edge.leave_now): run it for real.
    result = subprocess.run([sys.executable, "-m", "ddp_train", "--data-dir", str(data_dir),
                             "--run-dir", str(tmp_path / "run"), *TINY],
                            env=trainer_env(**env), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddp-train: error: "), result.stderr
