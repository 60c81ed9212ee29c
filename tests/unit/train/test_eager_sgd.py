"""EagerSGD (ddp_train/recipe/eager_sgd.py): torch.optim.SGD's steps and state, bit for bit, without the
import of torch._dynamo that torch's compile guards on the optimizer's methods make in every rank."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import pytest
import torch

from train_helpers import TINY_ARGS, trainer_env
from ddp_train.recipe.eager_sgd import EagerSGD

SETTINGS = {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 5e-4}


def model_and(optimizer_class, fused: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return model, optimizer_class(model.parameters(), fused=fused, **SETTINGS)


def train(model, optimizer, steps: int, seed: int = 1) -> None:
    """`steps` steps on fixed random data, with grad mode on as a training loop has it: an optimizer
    that updated the weights under autograd would fail on the leaves' in-place update."""
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        model(torch.randn(5, 6, generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def same_weights_and_momentum(model_a, sgd_a, model_b, sgd_b) -> bool:
    pairs = zip(model_a.parameters(), model_b.parameters())
    return all(torch.equal(a, b) and torch.equal(sgd_a.state[a]["momentum_buffer"], sgd_b.state[b]["momentum_buffer"])
               for a, b in pairs)


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_eager_sgd_takes_torch_sgds_steps_exactly(fused):
    ours, theirs = model_and(EagerSGD, fused), model_and(torch.optim.SGD, fused)
    train(*ours, steps=4)
    train(*theirs, steps=4)
    assert same_weights_and_momentum(*ours, *theirs)
    assert all(not p.requires_grad or p.grad_fn is None for p in ours[0].parameters())
    assert isinstance(ours[1], torch.optim.SGD)  # what LossScaler and checkpoint.py take


def test_a_checkpoint_of_either_optimizer_continues_in_the_other():
    # A run's checkpoint written before EagerSGD (torch.optim.SGD's state_dict) resumes under it, and back.
    for writer, reader in ((torch.optim.SGD, EagerSGD), (EagerSGD, torch.optim.SGD)):
        model, sgd = model_and(writer, fused=False)
        train(model, sgd, steps=3)
        resumed_model, resumed = model_and(reader, fused=False)
        resumed_model.load_state_dict(model.state_dict())
        resumed.load_state_dict(copy.deepcopy(sgd.state_dict()))  # a copy, as a checkpoint file is
        assert resumed.state_dict()["param_groups"] == sgd.state_dict()["param_groups"]
        train(model, sgd, steps=2, seed=5)
        train(resumed_model, resumed, steps=2, seed=5)
        assert same_weights_and_momentum(model, sgd, resumed_model, resumed), (writer, reader)


def test_a_cpu_run_and_its_resume_never_import_torch_dynamo(ten_class_data, tmp_path):
    # The whole trainer in one process, trained and then resumed for one epoch more (load_state_dict):
    # torch._dynamo costs a rank about as much CPU as `import torch` and a CPU run compiles nothing.
    args = ["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS, "--limit-train", "64",
            "--target-accuracy", "1.1"]
    script = textwrap.dedent(f"""
        import sys
        from ddp_train import cli
        codes = [cli.main({args!r} + ["--epochs", "1"]), cli.main({args!r} + ["--epochs", "2"])]
        print("exit codes", codes, "torch._dynamo", "torch._dynamo" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], env=trainer_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Resumed from" in done.stdout, done.stdout
    assert done.stdout.splitlines()[-1] == "exit codes [0, 0] torch._dynamo False", done.stdout + done.stderr
