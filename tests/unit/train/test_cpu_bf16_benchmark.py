"""benchmarks/cpu_bf16.py: its agreement verdict compares bf16 with fp32 at the same seed against
fp32's own spread across seeds, and its step part runs (tiny settings) with one row per oneDNN cap."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from train_helpers import trainer_env

from cpu_bf16 import ISA_CAPS, largest_difference, seed_spread

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "cpu_bf16.py"


def run(accuracy: list[float]) -> dict:
    return {"val_accuracy": accuracy}


def test_the_seed_spread_is_the_largest_epoch_difference_between_any_two_seeds():
    fp32 = [run([0.1, 0.70]), run([0.3, 0.55]), run([0.2, 0.75])]
    assert seed_spread(fp32, "val_accuracy") == pytest.approx(0.20)  # seeds 1 and 2 at epoch 2
    assert seed_spread(fp32[:1], "val_accuracy") == 0.0  # one seed: nothing to compare with


def test_a_bf16_run_is_judged_by_its_largest_difference_from_fp32_at_any_epoch():
    assert largest_difference(run([0.1, 0.70]), run([0.05, 0.72]), "val_accuracy") == pytest.approx(0.05)


def test_the_step_part_prints_one_row_per_isa_cap_with_what_auto_picks():
    done = subprocess.run([sys.executable, str(BENCH), "--only", "step", "--width-scale", "0.03",
                           "--batch-size", "8", "--rounds", "1", "--round-s", "0.2", "--json"],
                          env=trainer_env(), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    step = json.loads(done.stdout.splitlines()[-1])["step"]
    assert list(step) == ["as found", *ISA_CAPS[1:]]
    assert all(row["fp32"] > 0 and row["bf16"] > 0 for row in step.values())
    assert step["AVX2"]["auto"] == step["AVX512_CORE"]["auto"] == "fp32"  # capped below bf16: never bf16
