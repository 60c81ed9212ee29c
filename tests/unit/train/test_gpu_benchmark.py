"""benchmarks/gpu_throughput.py runs on CPU (tiny settings) and prints its side-by-side table;
its FLOP count matches the guide's model size; each variant sets the inductor options it claims,
and an option this torch lacks is a row that says so, not a crash."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train_helpers import trainer_env

from ddp_train.fast.bn_blocks import TritonBasicBlock
from ddp_train.fast.cudagraph_report import CUDA_GRAPH_MODES
from ddp_train.recipe.model import WideResNet
from gpu_throughput import (VARIANTS, Variant, block_of, forward_macs_per_image, inductor_option, inductor_options,
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
    assert eager[2] == "fp32"  # the CPU's default precision
    assert float(eager[3].replace(",", "")) > 0 and float(eager[7]) > 0  # images/s, setup s
    assert " ".join(eager[8:]) == "not used (CPU: CUDA graphs need a GPU)"
    assert by_key[("guide", "8")][6] == "1.00x"
    assert by_key[("graphs", "8")][3] == "-" and "CUDA graphs need a GPU" in done.stdout
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


def test_two_precisions_alternate_in_rounds_and_a_line_gives_their_ratio_round_by_round(tmp_path):
    # fp16 is the trainer's: autocast, loss scaling on the device, fused SGD (CPU kernels here).
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(BENCH), "--device", "cpu", "--variants", "eager", "--precisions", "fp32,fp16",
         "--rounds", "2", "--batches", "8", "--steps", "1", "--warmup-steps", "1", "--baseline-images", "0",
         "--matmul-size", "128", "--json", str(out)],
        env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("eager ")]
    assert [(r[1], r[2]) for r in rows] == [("8", "fp32"), ("8", "fp16")]
    records = json.loads(out.read_text())
    assert [(r["precision"], len(r["rounds"])) for r in records] == [("fp32", 2), ("fp16", 2)]
    assert all(r["images_per_s"] == max(r["rounds"]) for r in records)  # a row is its best round
    ratio = next(line for line in done.stdout.splitlines() if "fp16/fp32" in line)
    per_round = [a / b for a, b in zip(records[1]["rounds"], records[0]["rounds"])]
    assert ratio == (f"  eager at batch 8: fp16/fp32 {records[1]['images_per_s'] / records[0]['images_per_s']:.3f}x "
                     f"(rounds: {', '.join(f'{r:.3f}' for r in per_round)})")


def test_our_triton_batchnorm_variant_is_listed_and_needs_a_gpu():
    variant = next(v for v in VARIANTS if v.name == "triton-bn")
    assert variant.mode == "reduce-overhead" and variant.triton_bn
    assert block_of(variant) is TritonBasicBlock
    assert "CUDA graphs need a GPU" in not_run_because(variant, torch.device("cpu"))
    eager_variant = Variant("eager-triton", None, "eager + our kernels", triton_bn=True)
    assert not_run_because(eager_variant, torch.device("cpu")).startswith("our Triton kernels need a GPU")


@pytest.mark.parametrize("precisions", ["fp8", "bf16,bf16", ","])
def test_a_precision_list_it_cannot_run_is_a_usage_error_naming_the_choices(precisions):
    done = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--precisions", precisions, "--list"],
                          env=trainer_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "name each of bf16, fp16, fp32 at most once" in done.stderr.splitlines()[-1]
