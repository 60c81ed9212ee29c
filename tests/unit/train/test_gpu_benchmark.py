"""benchmarks/gpu_throughput.py runs on CPU (tiny settings) and prints its side-by-side table;
its FLOP count matches the guide's model size."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train_helpers import trainer_env

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_throughput.py"
sys.path.insert(0, str(BENCH.parent))
from gpu_throughput import forward_macs_per_image  # noqa: E402
from ddp_train.model import WideResNet  # noqa: E402


def test_full_model_counts_the_guides_2_41_gmac_per_image():
    macs = forward_macs_per_image(WideResNet(100, 1.0), torch.device("cpu"))
    assert macs / 1e9 == pytest.approx(2.41, abs=0.01)  # 6x: 14.47 GFLOP per training image (2 FLOP/MAC, backward = 2x forward)


def test_cpu_run_prints_every_variant_and_batch_beside_the_guide_baseline():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--device", "cpu", "--variants", "eager,graphs", "--batches", "8,16",
         "--steps", "2", "--warmup-steps", "1", "--baseline-images", "64", "--workers", "0",
         "--matmul-size", "128"],
        env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    by_key = {(r[0], r[1]): r for r in rows if len(r) > 2 and r[1].isdigit()}
    assert set(by_key) == {("guide", "8"), ("eager", "8"), ("eager", "16"), ("graphs", "8"), ("graphs", "16")}
    assert float(by_key[("eager", "16")][2].replace(",", "")) > 0
    assert by_key[("guide", "8")][5] == "1.00x"
    assert by_key[("graphs", "8")][2] == "-" and "CUDA graphs need a GPU" in done.stdout
    assert "matmul ceiling" in done.stdout and "GFLOP per training image" in done.stdout
