"""--grad-accum-steps: N micro-batches per step give the large batch's gradients, with one
all-reduce per step (DDP's no_sync() for all but the last micro-batch).

DDP documents the rule: inside no_sync() "gradients will be accumulated on module variables,
which will later be synchronized in the first forward-backward pass exiting the context"
(https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync).

Equality is exact (to float64 rounding) only where the loss is a mean of per-image terms. The
WideResNet's BatchNorm in training mode normalises each micro-batch by its own statistics, so
there the gradients are a smaller batch's (as on a smaller GPU) and differ; these tests use
eval-mode BatchNorm (running statistics: every image computed alone), dropout 0 and float64.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn

from ddp_train.recipe.learner import accumulate_gradients, gradient_sync
from ddp_train.config import config_from_args
from ddp_train.resolve import check_world
from ddp_train.errors import TrainError
from ddp_train.recipe.model import WideResNet
from train_helpers import TINY_ARGS, run_trainer, trainer_env

WORLD, PER_RANK = 2, 8


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return WideResNet(100, 1 / 16, 0.0).double()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(WORLD * PER_RANK, 3, 32, 32, generator=generator, dtype=torch.float64)
    return x, torch.randint(0, 100, (WORLD * PER_RANK,), generator=generator)


def gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def accumulated(model: nn.Module, x, y, steps: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = accumulate_gradients(x, y, steps, model, lambda xs, ys: nn.functional.cross_entropy(model(xs), ys),
                                lambda micro_loss: micro_loss.backward())
    return gradients(model), loss


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-12, msg=name)


def test_four_micro_batches_give_the_whole_batchs_gradients_and_loss():
    model = tiny_model().eval()
    x, y = batch()
    whole, whole_loss = accumulated(model, x, y, 1)
    parts, parts_loss = accumulated(model, x, y, 4)
    assert_same(parts, whole)
    torch.testing.assert_close(parts_loss, whole_loss)


def test_training_mode_batchnorm_is_why_the_comparison_uses_eval_mode():
    # If this ever passed with train-mode BN, the tests above would no longer prove anything new.
    model = tiny_model().train()
    x, y = batch()
    whole, _ = accumulated(model, x, y, 1)
    parts, _ = accumulated(model, x, y, 4)
    assert any(not torch.allclose(parts[n], whole[n], rtol=1e-6, atol=1e-9) for n in whole)


def test_no_sync_holds_back_every_micro_batch_but_the_last():
    plain = nn.Linear(2, 2)
    assert type(gradient_sync(plain, last=False)).__name__ == "nullcontext"  # a world of one


# Each rank: DDP over gloo, its half of the batch, N micro-batches; a comm hook counts all-reduces.
RANK_SCRIPT = textwrap.dedent("""
    import os, sys, torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel
    from test_grad_accumulation import PER_RANK, batch, tiny_model  # PYTHONPATH: this test's directory
    from ddp_train.recipe.learner import accumulate_gradients
    dist.init_process_group("gloo")
    rank, steps = dist.get_rank(), int(sys.argv[1])
    model = tiny_model().eval()
    ddp = DistributedDataParallel(model)
    calls = []
    def counting_hook(state, bucket):
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(None, bucket)
    ddp.register_comm_hook(None, counting_hook)
    x, y = batch()
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    accumulate_gradients(x[mine], y[mine], steps, ddp, lambda xs, ys: nn.functional.cross_entropy(ddp(xs), ys),
                         lambda micro_loss: micro_loss.backward())
    buckets = len(ddp._get_ddp_logging_data().get("bucket_sizes", "").split(","))
    torch.save({"grads": {n: p.grad for n, p in model.named_parameters()}, "calls": len(calls),
                "buckets": buckets}, sys.argv[2] + f".{rank}")
    dist.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_gradients(tmp_path, steps: int) -> list[dict]:
    port, out = str(free_port()), str(tmp_path / f"steps{steps}")
    # The ranks import this module: its directory on their path, before what the environment had.
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(filter(None, (here, os.environ.get("PYTHONPATH"))))
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(steps), out],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=trainer_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                                              LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                                              MASTER_PORT=port, PYTHONPATH=path))
             for rank in range(WORLD)]
    for p in procs:
        output = p.communicate(timeout=600)[0]  # a bound on a hang: `make test` runs this beside the e2e suite
        assert p.returncode == 0, output
    return [torch.load(f"{out}.{rank}") for rank in range(WORLD)]


def test_two_gloo_ranks_accumulating_match_one_process_on_the_whole_batch(tmp_path):
    x, y = batch()
    want, _ = accumulated(tiny_model().eval(), x, y, 1)  # 16 images at once, no DDP
    ranks = ddp_gradients(tmp_path, steps=4)             # 2 ranks x 4 micro-batches of 2
    for result in ranks:
        assert_same(result["grads"], want)
        # One all-reduce per bucket, in the last micro-batch only: three no_sync() passes sent nothing.
        assert result["calls"] == result["buckets"]


def test_micro_batches_must_split_each_ranks_share_evenly():
    config = config_from_args(["--batch-size", "40", "--grad-accum-steps", "4"])
    check_world(config, 2)
    with pytest.raises(TrainError, match="--batch-size 40 is not divisible by the world size 4 times "
                                         "--grad-accum-steps 4: pass a multiple of 16"):
        check_world(config, 4)
    with pytest.raises(TrainError, match="--grad-accum-steps 0 must be at least 1"):
        config_from_args(["--grad-accum-steps", "0"])


def test_a_run_with_micro_batches_says_so_and_trains(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "1", "--limit-train", "128", "--grad-accum-steps", "4"])
    assert result.returncode == 0, result.stderr
    assert "global batch 32 (32 per rank in 4 micro-batches of 8)" in result.stdout
