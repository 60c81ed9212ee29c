"""Mixed precision and EMA run end to end on CPU; fp16 carries its GradScaler in the checkpoint."""

import json
import math

import pytest
import torch

from ddp_train import cli
from ddp_train.synthetic import write_dataset


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_with_ema_trains_and_checkpoints(precision, tmp_path):
    write_dataset(tmp_path / "data", train=64, test=16, seed=4)
    run_dir = tmp_path / "run"
    code = cli.main(["--data-dir", str(tmp_path / "data"), "--run-dir", str(run_dir),
                     "--allow-unverified-data", "--batch-size", "32", "--epochs", "1",
                     "--width-scale", "0.0625", "--precision", precision, "--ema-decay", "0.9"])
    assert code == 0
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["precision"] == precision
    epoch = next(r for r in lines if r["type"] == "epoch")
    assert math.isfinite(epoch["train_loss"]) and math.isfinite(epoch["val_loss"])
    state = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert state["ema"] is not None
    assert bool(state["scaler"]) == (precision == "fp16")  # a disabled scaler saves {}
