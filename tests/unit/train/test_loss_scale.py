"""fp16 loss scaling on the device (ddp_train/fast/loss_scale.py), checked on CPU tensors with the ops the
GPU runs (torch's check, update and fused SGD kernels have CPU implementations): torch.amp.GradScaler
is the reference for every decision, and nothing reads a value back from the device."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ddp_train.recipe import learner
from ddp_train.config import TrainConfig
from ddp_train.resolve import resolve
from ddp_train.fast.loss_scale import LossScaler

CPU = torch.device("cpu")
GROWTH_INTERVAL = 3


def model_and_sgd(fused: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4,
                          fused=fused)
    return model, sgd


def reference_scaler():
    """torch's GradScaler, on the unfused SGD: its documented path, which skips optimizer.step()
    itself when a gradient is inf or NaN."""
    return torch.amp.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)


def ours():
    return LossScaler(CPU, enabled=True, growth_interval=GROWTH_INTERVAL)


def train(scaler, fused: bool, inf_at: set[int], steps: int):
    """`steps` scaled steps on fixed random data; at the steps in `inf_at` one gradient is inf."""
    model, sgd = model_and_sgd(fused)
    generator = torch.Generator().manual_seed(1)
    scales = []
    for step in range(steps):
        x = torch.randn(5, 6, generator=generator)
        scaler.scale(model(x).square().mean()).backward()
        if step in inf_at:
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(sgd)
        scaler.update()
        sgd.zero_grad(set_to_none=True)
        scales.append(scaler.state_dict()["scale"])
    return model, sgd, scales


def momentum(sgd, model):
    return [sgd.state[p].get("momentum_buffer") for p in model.parameters()]


def test_an_inf_gradient_skips_the_step_and_halves_the_scale_as_gradscaler_does():
    before, _ = model_and_sgd(fused=True)
    model, sgd, scales = train(ours(), fused=True, inf_at={0}, steps=1)
    _, _, reference_scales = train(reference_scaler(), fused=False, inf_at={0}, steps=1)
    assert scales == reference_scales == [2.0 ** 15]
    for got, was in zip(model.parameters(), before.parameters()):
        assert torch.equal(got, was)  # not one weight moved
    # GradScaler's unfused step leaves no momentum at all; ours leaves zeros, so the next step is a first step.
    assert all(torch.equal(b, torch.zeros_like(b)) for b in momentum(sgd, model))


def test_growth_interval_clean_steps_in_a_row_double_the_scale_as_gradscaler_does():
    scaler = ours()
    _, _, scales = train(scaler, fused=True, inf_at=set(), steps=2 * GROWTH_INTERVAL + 1)
    _, _, reference_scales = train(reference_scaler(), fused=False, inf_at=set(), steps=2 * GROWTH_INTERVAL + 1)
    assert scales == reference_scales
    assert scales == [2.0 ** 16] * 2 + [2.0 ** 17] * 3 + [2.0 ** 18] * 2
    assert scaler.state_dict()["_growth_tracker"] == 1


def test_skipped_and_clean_steps_train_as_gradscaler_with_the_unfused_sgd():
    # The first step skipped too: torch's fused SGD would leave its momentum buffers uninitialised there.
    inf_at, steps = {0, 4, 5}, 10
    model, sgd, scales = train(ours(), fused=True, inf_at=inf_at, steps=steps)
    reference, reference_sgd, reference_scales = train(reference_scaler(), fused=False, inf_at=inf_at, steps=steps)
    assert scales == reference_scales
    # The fused kernel rounds its multiply-adds once (FMA), the unfused ops twice: a few ulps apart.
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
    for got, want in zip(momentum(sgd, model), momentum(reference_sgd, reference)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)


def test_after_a_clean_first_step_it_is_bitwise_gradscalers_fused_path():
    inf_at, steps = {2, 3}, 8
    model, _, scales = train(ours(), fused=True, inf_at=inf_at, steps=steps)
    reference, _, reference_scales = train(reference_scaler(), fused=True, inf_at=inf_at, steps=steps)
    assert scales == reference_scales
    for got, want in zip(model.parameters(), reference.parameters()):
        assert torch.equal(got, want)


class DeviceReads(TorchDispatchMode):
    """Records the ops that copy a tensor's value to the host (Tensor.item, bool(tensor), float(tensor)
    all dispatch to aten._local_scalar_dense): on a GPU each one waits for the device."""

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in ("_local_scalar_dense", "is_nonzero", "item"):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def scaled_steps_watched(scaler, fused: bool) -> list[str]:
    model, sgd = model_and_sgd(fused)
    with DeviceReads() as watch:
        for bad in (True, False, False):
            scaler.scale(model(torch.randn(5, 6)).square().mean()).backward()
            if bad:
                model[0].weight.grad[0, 0] = float("nan")
            scaler.step(sgd)
            scaler.update()
            sgd.zero_grad(set_to_none=True)
    return watch.reads


def test_no_step_reads_a_value_back_from_the_device():
    assert scaled_steps_watched(ours(), fused=True) == []


def test_the_watch_sees_the_read_that_gradscalers_unfused_path_makes():
    # GradScaler._maybe_opt_step: `if not sum(v.item() ...)`: the check above can fail.
    assert scaled_steps_watched(reference_scaler(), fused=False)


def test_the_scale_and_the_inf_flag_stay_at_one_address_and_leave_nothing_on_the_optimizer():
    scaler = ours()
    addresses = (scaler.scale_factor.data_ptr(), scaler.growth_tracker.data_ptr(), scaler.found_inf.data_ptr())
    _, sgd, _ = train(scaler, fused=True, inf_at={1}, steps=3)
    assert (scaler.scale_factor.data_ptr(), scaler.growth_tracker.data_ptr(), scaler.found_inf.data_ptr()) == addresses
    assert not hasattr(sgd, "grad_scale") and not hasattr(sgd, "found_inf")


def test_the_state_dict_is_gradscalers_and_loads_either_way():
    scaler = ours()
    train(scaler, fused=True, inf_at={0}, steps=2)
    saved = scaler.state_dict()
    reference = reference_scaler()
    train(reference, fused=False, inf_at={0}, steps=2)
    assert saved == reference.state_dict()
    assert saved == {"scale": 2.0 ** 15, "growth_factor": 2.0, "backoff_factor": 0.5,
                     "growth_interval": GROWTH_INTERVAL, "_growth_tracker": 1}
    fresh = LossScaler(CPU, enabled=True)
    fresh.load_state_dict(reference.state_dict())  # a checkpoint written by GradScaler resumes
    assert fresh.state_dict() == saved
    loaded = torch.amp.GradScaler("cpu")
    loaded.load_state_dict(saved)
    assert loaded.state_dict() == saved


def test_an_enabled_scaler_refuses_an_empty_state_as_gradscaler_does():
    with pytest.raises(RuntimeError, match="without fp16"):
        ours().load_state_dict({})


def test_a_disabled_scaler_passes_everything_through():
    scaler = LossScaler(CPU, enabled=False)
    model, sgd = model_and_sgd(fused=False)
    loss = model(torch.randn(2, 6)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = model[0].weight.detach().clone()
    scaler.step(sgd)
    scaler.update()
    assert not torch.equal(model[0].weight, before)
    assert scaler.state_dict() == {} and not scaler.is_enabled()
    scaler.load_state_dict({})


def test_an_unfused_optimizer_is_refused_naming_the_fix():
    model, sgd = model_and_sgd(fused=False)
    model(torch.randn(2, 6)).sum().backward()
    with pytest.raises(ValueError, match=r"fused=True"):
        ours().step(sgd)


@pytest.mark.parametrize("precision, scaled", [("fp16", True), ("bf16", False), ("fp32", False)])
def test_the_learner_scales_fp16_only_and_then_with_the_fused_sgd(precision, scaled):
    built = learner.build_learner(resolve(TrainConfig(width_scale=1 / 16, batch_size=32, precision=precision), "cpu", 1,
                                          gpu_bf16=False, cpu_bf16=None), 0, CPU)
    assert isinstance(built.scaler, LossScaler) and built.scaler.is_enabled() == scaled
    if scaled:
        assert built.optimizer.param_groups[0]["fused"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the captured scaler step needs a GPU")
def test_on_the_gpu_the_scaled_step_syncs_nothing_and_replays_as_a_captured_cuda_graph():
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 64, device=cuda)) for _ in range(3)]
    sgd = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, fused=True)
    scaler = LossScaler(cuda, enabled=True, growth_interval=2)
    for p in params:
        p.grad = torch.randn_like(p)
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call raises
    try:
        scaler.step(sgd)  # eager, and makes the momentum buffers before the capture
        scaler.update()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm the capture's stream, as torch.cuda.graphs' docs do
        scaler.step(sgd)
        scaler.update()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scaler.step(sgd)
        scaler.update()
    weights = [p.detach().clone() for p in params]
    scale = scaler.scale_factor.item()
    for p in params:  # in place: the graph reads the gradients at their captured addresses
        p.grad.copy_(torch.randn_like(p) * scale)
    params[1].grad[3, 3] = float("inf")
    graph.replay()
    assert all(torch.equal(p, w) for p, w in zip(params, weights)) and scaler.scale_factor.item() == scale / 2
    params[1].grad[3, 3] = 1.0
    graph.replay()
    assert not torch.equal(params[0], weights[0]) and scaler.found_inf.item() == 0
