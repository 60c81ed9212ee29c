"""benchmarks/bn_bandwidth.py without a GPU: its cases are the model's block BatchNorms, and it says in
one line that it needs a GPU. The bytes it counts per pass are checked against the kernels' own loads
and stores under Triton's interpreter (bn_interpreter_cases.py)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from train_helpers import trainer_env

from bn_bandwidth import cases
from ddp_train.config import GPU_BATCH_PER_RANK
from ddp_train.recipe.model import BasicBlock, WideResNet

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bn_bandwidth.py"


def test_the_cases_are_the_block_batchnorms_of_the_default_model_each_twice():
    seen: Counter = Counter()
    model = WideResNet(100, 1.0, 0.0)
    hooks = []
    for block in (m for m in model.modules() if isinstance(m, BasicBlock)):
        for bn, residual in ((block.bn1, False), (block.bn2, True)):
            hooks.append(bn.register_forward_hook(
                lambda _m, inputs, _out, residual=residual: seen.update([(inputs[0].shape[1], inputs[0].shape[2],
                                                                          residual)])))
    with torch.no_grad():
        model(torch.zeros(2, 3, 32, 32))
    for hook in hooks:
        hook.remove()
    listed = cases(GPU_BATCH_PER_RANK)
    assert Counter({(c.channels, c.size, c.residual): 2 for c in listed}) == seen  # the summary counts each twice
    assert {c.batch for c in listed} == {GPU_BATCH_PER_RANK}


def test_the_help_needs_no_gpu():
    done = subprocess.run([sys.executable, str(BENCH), "--help"], env=trainer_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert all(flag in done.stdout for flag in ("--batch", "--dtype", "--calls", "--json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gets")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    done = subprocess.run([sys.executable, str(BENCH)], env=trainer_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == "bn_bandwidth: no CUDA GPU is visible; run it on a GPU node"
