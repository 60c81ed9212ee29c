"""benchmarks/gpu_throughput.py runs on CPU (tiny settings) and prints its side-by-side table;
its FLOP count matches the guide's model size; each variant sets the inductor options it claims,
and an option this torch lacks is a row that says so, not a crash."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train_helpers import trainer_env

from ddp_train.cudagraph_report import CUDA_GRAPH_MODES
from ddp_train.model import WideResNet
from gpu_throughput import (VARIANTS, Variant, forward_macs_per_image, inductor_option, inductor_options,
                            missing_options, not_run_because)

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_throughput.py"


def test_full_model_counts_the_guides_2_41_gmac_per_image():
    macs = forward_macs_per_image(WideResNet(100, 1.0), torch.device("cpu"))
    assert macs / 1e9 == pytest.approx(2.41, abs=0.01)  # 6x: 14.47 GFLOP per training image (2 FLOP/MAC, backward = 2x forward)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.inductor], ids=lambda v: v.name)
def test_each_variant_sets_the_inductor_options_it_claims_and_only_while_it_runs(variant):
    assert missing_options(variant) == []  # a typo in a name fails here (torch 2.14 has them all)
    before = {name: inductor_option(name) for name, _ in variant.inductor}
    with inductor_options(variant):
        for name, value in variant.inductor:
            assert inductor_option(name) == value, name
            assert before[name] != value, f"{name}={value} is already the default: the lever does nothing"
    assert {name: inductor_option(name) for name, _ in variant.inductor} == before


def test_the_modes_turn_on_what_the_variants_say():
    # torch.compile(mode=...) applies these options (torch._inductor.list_mode_options).
    for v in VARIANTS:
        options = torch._inductor.list_mode_options(v.mode) if v.mode else {}
        assert bool(options.get("triton.cudagraphs")) == (v.mode in CUDA_GRAPH_MODES), v.name
        assert bool(options.get("max_autotune")) == (v.mode == "max-autotune"), v.name


def test_an_option_this_torch_lacks_is_reported_not_run():
    typo = Variant("typo", "reduce-overhead", "graphs + a misspelt option", (("triton.enable_pdll", True),))
    assert not_run_because(typo, torch.device("cuda")) == (
        f"torch {torch.__version__} has no inductor option triton.enable_pdll")
    assert not_run_because(typo, torch.device("cpu")) == "CUDA graphs need a GPU"


def test_list_names_every_variant_with_its_options_without_a_gpu():
    done = subprocess.run([sys.executable, str(BENCH), "--device", "cuda", "--list"],
                          env=trainer_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0] for line in done.stdout.splitlines()[1:]}
    assert listed == {v.name for v in VARIANTS}
    assert "triton.enable_pdl=True" in done.stdout and "NOT IN THIS TORCH" not in done.stdout


def test_cpu_run_prints_every_variant_and_batch_beside_the_guide_baseline(tmp_path):
    cache = tmp_path / "cache"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--device", "cpu", "--variants", "eager,graphs,pdl", "--batches", "8,16",
         "--steps", "2", "--warmup-steps", "1", "--baseline-images", "64", "--workers", "0",
         "--matmul-size", "128", "--compile-cache-dir", str(cache)],
        env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    by_key = {(r[0], r[1]): r for r in rows if len(r) > 2 and r[1].isdigit()}
    assert set(by_key) == {("guide", "8"), *((v, b) for v in ("eager", "graphs", "pdl") for b in ("8", "16"))}
    eager = by_key[("eager", "16")]
    assert float(eager[2].replace(",", "")) > 0 and float(eager[6]) > 0  # images/s, setup s
    assert " ".join(eager[7:]) == "not used (CPU: CUDA graphs need a GPU)"
    assert by_key[("guide", "8")][5] == "1.00x"
    assert by_key[("graphs", "8")][2] == "-" and "CUDA graphs need a GPU" in done.stdout
    assert "matmul ceiling" in done.stdout and "GFLOP per training image" in done.stdout
    assert f"compile cache: {cache}" in done.stdout and cache.is_dir()


def test_a_variant_that_fails_is_a_row_with_its_error_and_the_run_goes_on():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--device", "cpu", "--variants", "eager-fused,eager", "--batches", "8",
         "--steps", "1", "--warmup-steps", "1", "--baseline-images", "0", "--matmul-size", "128",
         "--dropout", "0.01"],
        env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.split()[1:2] == ["8"]}
    assert "failed: ValueError: a fused block has no dropout" in rows["eager-fused"]
    assert "not used" in rows["eager"]
