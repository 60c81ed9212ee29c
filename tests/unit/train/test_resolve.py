"""One resolve pass: the run's decisions from the flags, the device and the world, made once."""

import dataclasses

import pytest

from ddp_train.config import config_from_args
from ddp_train.errors import Seen, TrainError
from ddp_train.precision import CpuBf16
from ddp_train.resolve import resolve

NATIVE = CpuBf16(True, "the CPU has avx512_bf16: it computes bf16 natively")
EMULATED = CpuBf16(False, "the CPU has no avx512_bf16 or amx_bf16: bf16 would be emulated")


def test_eight_gpus_with_no_flags_decide_the_improved_recipes_gpu_path():
    decided = resolve(config_from_args([]), "cuda", 8, gpu_bf16=True, cpu_bf16=None)
    assert decided.config.batch_size == 8 * 1024 and decided.config.backend == "nccl"  # recorded as decided
    assert decided.precision.name == "bf16"
    assert (decided.compiled, decided.compile_mode, decided.cuda_graphs) == (True, "reduce-overhead", True)
    assert (decided.levers, decided.bn_kernels) == ((), "torch")
    assert decided.lr_peak == pytest.approx(0.05 * 8192 / 512)


def test_the_cpu_decides_gloo_eager_and_its_own_bf16_answer():
    decided = resolve(config_from_args([]), "cpu", 2, gpu_bf16=False, cpu_bf16=EMULATED)
    assert (decided.config.batch_size, decided.config.backend) == (512, "gloo")
    assert (decided.compiled, decided.compile_mode, decided.cuda_graphs, decided.precision.name) == (
        False, "eager", False, "fp32")
    # Another node's CPU computes bf16 natively and this one does not: every rank takes the agreed answer.
    agreed = decided.with_cpu_bf16(EMULATED)
    assert agreed.precision == decided.precision
    assert resolve(config_from_args([]), "cpu", 2, False, NATIVE).with_cpu_bf16(EMULATED).precision.name == "fp32"
    assert dataclasses.replace(decided, precision=agreed.precision) == agreed  # nothing else moves


def test_a_decision_that_cannot_be_made_says_which_ranks_see_it():
    with pytest.raises(TrainError, match="--batch-size 100 is not divisible by the world size 8") as uneven:
        resolve(config_from_args(["--batch-size", "100"]), "cuda", 8, True, None)
    assert uneven.value.seen is Seen.BY_EVERY_RANK
    with pytest.raises(TrainError, match="no bf16 support") as old_gpu:
        resolve(config_from_args(["--precision", "bf16"]), "cuda", 1, False, None)
    assert old_gpu.value.seen is Seen.BY_EVERY_RANK_OF_NODE
    with pytest.raises(TrainError, match="--backend nccl needs CUDA GPUs"):
        resolve(config_from_args(["--backend", "nccl"]), "cpu", 1, False, EMULATED)
