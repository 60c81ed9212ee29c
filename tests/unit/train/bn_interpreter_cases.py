"""Our Triton BatchNorm kernels (ddp_train/fast/bn_kernels.py, bn_blocks.py) against nn.BatchNorm2d, run by
Triton's interpreter on CPU tensors. The interpreter is chosen when triton is imported, so these
cases run in a process of their own under TRITON_INTERPRET=1 (test_triton_bn.py starts it; by hand:
`TRITON_INTERPRET=1 python -m pytest tests/unit/train/bn_interpreter_cases.py`). The file name keeps
them out of the ordinary collection, where triton is imported without the interpreter.

Shapes are small (the interpreter runs each program in Python) but reach every path: channel
counts that are not a multiple of the channel block (70 = 64 + 6, 5), row counts that end inside a
tile (300 = 4 x 64 + 44), reductions over several programs (partials > 1), and several tiles per
program (a target of 2 programs). The interpreter casts fp32 to bf16 by truncation (numpy has no
bf16: triton/runtime/interpreter.py, `_convert_float` without a rounding mode) where a GPU rounds to
nearest, so bf16 results may be one bf16 step further from the reference than on a GPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ddp_train.fast import bn_kernels
from ddp_train.fast.bn_blocks import TritonBasicBlock, batch_norm_act, bn_act, bn_act_backward
from ddp_train.recipe.model import WideResNet
from compiled_graphs import compiled_step_graphs, op_count

if os.environ.get("TRITON_INTERPRET") != "1":
    raise RuntimeError("run these cases under TRITON_INTERPRET=1 (tests/unit/train/test_triton_bn.py starts them)")

CHANNELS_LAST = dict(memory_format=torch.channels_last)
# Largest error relative to the reference's largest value: fp32 arithmetic, or one or two steps of the
# activation dtype's rounding (bf16: 2^-8, fp16: 2^-11) on the outputs written in that dtype.
TOLERANCE = {torch.float32: 2e-6, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}
BLOCKS = 6  # WideResNet: three stages of two blocks


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def activation(shape, dtype, offset=0.0, seed=0):
    torch.manual_seed(seed)
    return (torch.randn(shape) * 2 + offset).to(dtype).contiguous(**CHANNELS_LAST)


def twin_batchnorms(channels):
    torch.manual_seed(1)
    ours, reference = torch.nn.BatchNorm2d(channels), torch.nn.BatchNorm2d(channels)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.normal_()
        ours.running_mean.normal_()
        ours.running_var.uniform_(0.5, 2.0)
    reference.load_state_dict(ours.state_dict())
    return ours, reference


SHAPES = {
    "70 channels, 300 rows, 5 partials": (3, 70, 10, 10),
    "5 channels, one program": (2, 5, 7, 3),
    "48 channels, 2 partials": (4, 48, 9, 9),
}


@pytest.mark.parametrize("target_programs", [bn_kernels.TARGET_PROGRAMS, 2], ids=["planned", "several tiles each"])
@pytest.mark.parametrize("relu, residual", [(True, True), (True, False), (False, False), (False, True)],
                         ids=["relu+add", "relu", "plain", "add"])
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
def test_fp32_forward_backward_and_running_statistics_match_batchnorm2d(shape, relu, residual, target_programs,
                                                                         monkeypatch):
    monkeypatch.setattr(bn_kernels, "TARGET_PROGRAMS", target_programs)
    compare_with_batchnorm2d(shape, torch.float32, relu, residual)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("relu, residual", [(True, True), (True, False)], ids=["relu+add", "relu"])
def test_half_precision_activations_with_fp32_statistics_match_batchnorm2d(dtype, relu, residual):
    compare_with_batchnorm2d(SHAPES["70 channels, 300 rows, 5 partials"], dtype, relu, residual)


def compare_with_batchnorm2d(shape, dtype, relu, residual):
    """Our op against nn.BatchNorm2d (+add, +ReLU) in fp32 on the same values: the output, the
    gradients of x, weight, bias and the residual, and the running statistics."""
    ours, reference = twin_batchnorms(shape[1])
    x = activation(shape, dtype, offset=3.0).requires_grad_()
    res = activation(shape, dtype, seed=2).requires_grad_() if residual else None
    y = batch_norm_act(x, ours, res, relu)
    grad_y = activation(shape, dtype, seed=3)
    y.backward(grad_y)

    x32 = x.detach().float().requires_grad_()
    res32 = res.detach().float().requires_grad_() if residual else None
    want = reference(x32) + (res32 if residual else 0)
    want = torch.relu(want) if relu else want
    want.backward(grad_y.float())

    tolerance = TOLERANCE[dtype]
    assert y.dtype == dtype and y.is_contiguous(**CHANNELS_LAST)
    assert relative_error(y, want) < tolerance
    assert x.grad.dtype == dtype and relative_error(x.grad, x32.grad) < 2 * tolerance
    if residual:
        assert relative_error(res.grad, res32.grad) < tolerance
    # Per-channel fp32 sums, whatever the activations' dtype (the gradient is read from the same values).
    assert ours.weight.grad.dtype == torch.float32
    assert relative_error(ours.weight.grad, reference.weight.grad) < 1e-5
    assert relative_error(ours.bias.grad, reference.bias.grad) < 1e-5
    for name in ("running_mean", "running_var"):
        assert relative_error(getattr(ours, name), getattr(reference, name)) < 1e-5, name
    assert ours.num_batches_tracked.item() == reference.num_batches_tracked.item() == 1


def test_the_variance_of_values_far_from_zero_keeps_its_digits():
    # A mean of 1000 and a standard deviation of 1: a sum of squares in fp32 would lose the variance
    # (1000^2 * 2^-24 per value); partial means and squared deviations keep it.
    x = activation((3, 70, 10, 10), torch.float32, offset=1000.0)
    _, mean, var, invstd = bn_act(x, torch.ones(70), torch.zeros(70), None, False, 1e-5)
    exact = x.double().permute(1, 0, 2, 3).reshape(70, -1)
    assert relative_error(mean, exact.mean(1)) < 1e-6
    torch.testing.assert_close(var.double(), exact.var(1, unbiased=False), rtol=1e-4, atol=0)
    torch.testing.assert_close(invstd.double(), (exact.var(1, unbiased=False) + 1e-5).rsqrt(), rtol=1e-4, atol=0)


@pytest.mark.parametrize("residual", [True, False], ids=["relu+add", "relu"])
def test_both_ops_pass_torchs_custom_op_checks(residual):
    # Schema, fake (shape-only) versions, autograd registration and AOT dispatch, as torch.compile uses them:
    # https://pytorch.org/docs/stable/library.html#torch.library.opcheck
    x = activation((2, 6, 5, 5), torch.float32).requires_grad_()
    weight, bias = (torch.rand(6) + 0.5).requires_grad_(), torch.randn(6).requires_grad_()
    res = activation((2, 6, 5, 5), torch.float32, seed=1).requires_grad_() if residual else None
    torch.library.opcheck(bn_act, (x, weight, bias, res, True, 1e-5))
    y, mean, _, invstd = bn_act(x, weight, bias, res, True, 1e-5)
    torch.library.opcheck(bn_act_backward, (torch.randn_like(y), y.detach(), x.detach(), weight.detach(), mean,
                                            invstd, residual, True))


def twin_models():
    torch.manual_seed(0)
    plain = WideResNet(10, 1 / 16, 0.0).to(**CHANNELS_LAST)
    ours = WideResNet(10, 1 / 16, 0.0, block=TritonBasicBlock).to(**CHANNELS_LAST)
    ours.load_state_dict(plain.state_dict())  # the same state dict: checkpoints carry over
    return plain, ours


def batch(size=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 3, 32, 32, generator=generator).contiguous(**CHANNELS_LAST)
    return x, torch.randint(0, 10, (size,), generator=generator)


def test_a_model_of_triton_blocks_trains_like_the_plain_one():
    # Each step from the same weights: in fp32 a ReLU decision flipped by rounding sends two tiny
    # models apart within a few steps, whichever implementation (see test_fused_blocks.py).
    plain, ours = twin_models()
    sgd = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9)
    for step in range(2):
        ours.load_state_dict(plain.state_dict())
        x, y = batch(seed=step)
        losses = [torch.nn.functional.cross_entropy(model(x), y) for model in (plain, ours)]
        for loss in losses:
            loss.backward()
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
        for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
            assert relative_error(q.grad, p.grad) < 1e-4, f"step {step}: gradient of {name}"
            q.grad = None
        for (name, a), b in zip(plain.state_dict().items(), ours.state_dict().values()):
            if "running" in name:
                assert relative_error(b, a) < 1e-5, f"step {step}: {name}"
        sgd.step()
        sgd.zero_grad(set_to_none=True)
    ours.load_state_dict(plain.state_dict())
    plain.eval()
    ours.eval()
    x, _ = batch(seed=9)
    torch.testing.assert_close(ours(x), plain(x), rtol=0, atol=0)  # evaluation: BasicBlock's own forward


def test_under_bf16_autocast_the_gradients_are_no_further_from_float64_than_the_plain_blocks():
    # The GPU path's precision, on CPU: the convolutions' bf16 outputs reach the op as bf16.
    plain, ours = twin_models()
    truth = WideResNet(10, 1 / 16, 0.0).double()
    truth.load_state_dict(plain.state_dict())
    x, y = batch(size=4)
    torch.nn.functional.cross_entropy(truth(x.double()), y).backward()
    errors = {}
    for name, model in (("plain", plain), ("ours", ours)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        got = torch.cat([p.grad.double().flatten() for p in model.parameters()])
        want = torch.cat([p.grad.flatten() for p in truth.parameters()])
        errors[name] = ((got - want).norm() / want.norm()).item()
    assert all(p.grad.dtype == torch.float32 for p in ours.parameters())
    assert errors["ours"] < 1.5 * errors["plain"], errors


def test_torch_compile_sees_one_op_per_batchnorm_forward_and_backward():
    plain, ours = twin_models()
    x, _ = batch()
    graphs = compiled_step_graphs(ours, x)  # fullgraph: no graph break
    plain(x).square().mean().backward()
    assert op_count(graphs["forward"], torch.ops.ddp_train.bn_act.default) == 2 * BLOCKS
    assert op_count(graphs["backward"], torch.ops.ddp_train.bn_act_backward.default) == 2 * BLOCKS
    for (name, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert relative_error(q.grad, p.grad) < 1e-4, f"compiled gradient of {name}"


def test_inputs_the_kernels_do_not_take_are_refused_by_name():
    with pytest.raises(ValueError, match="bf16, fp16 or fp32"):
        bn_kernels.check_input(torch.zeros(2, 3, 4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="channels_last"):
        bn_kernels.check_input(torch.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn_kernels.check_input(torch.zeros(1, 3, 1, 1).contiguous(**CHANNELS_LAST))


@pytest.mark.parametrize("residual", [False, True], ids=["relu", "relu+add"])
def test_each_pass_moves_the_bytes_the_bandwidth_benchmark_counts(residual, monkeypatch):
    # benchmarks/bn_bandwidth.py divides these bytes by each pass's time. Counted here from the
    # interpreter's own loads and stores: the activations are bf16, everything else fp32.
    from bn_bandwidth import pass_bytes
    from triton.runtime.interpreter import interpreter_builder
    import triton.language as tl
    moved = [0]
    load, store = interpreter_builder.create_masked_load, interpreter_builder.create_masked_store

    def counted(element_type, mask, ptrs):
        if element_type == tl.bfloat16:
            moved[0] += 2 * int(np.broadcast_to(mask.data, ptrs.data.shape).sum())

    def counted_load(ptrs, mask, *rest):
        counted(ptrs.get_element_ty(), mask, ptrs)
        return load(ptrs, mask, *rest)

    def counted_store(ptrs, value, mask, *rest):
        counted(ptrs.get_element_ty(), mask, ptrs)
        return store(ptrs, value, mask, *rest)
    monkeypatch.setattr(interpreter_builder, "create_masked_load", counted_load)
    monkeypatch.setattr(interpreter_builder, "create_masked_store", counted_store)

    shape = SHAPES["70 channels, 300 rows, 5 partials"]
    x, grad_y = activation(shape, torch.bfloat16), activation(shape, torch.bfloat16, seed=1)
    res = activation(shape, torch.bfloat16, seed=2) if residual else None
    weight, bias = torch.rand(shape[1]) + 0.5, torch.randn(shape[1])
    layout = bn_kernels.plan(*bn_kernels.check_input(x))

    def bytes_of(run):
        moved[0] = 0
        out = run()
        return moved[0], out
    counts = {}
    counts["stats"], batch = bytes_of(lambda: bn_kernels.stats(x, 1e-5, layout))
    counts["apply"], y = bytes_of(lambda: bn_kernels.normalize(x, batch, weight, bias, res, True, layout))
    counts["grad stats"], terms = bytes_of(lambda: bn_kernels.grad_stats(
        grad_y, y, x, weight, batch.mean, batch.invstd, True, residual, layout))
    source = terms.g if residual else grad_y
    counts["input"], _ = bytes_of(lambda: bn_kernels.input_grad(source, y, x, batch.mean, terms, not residual, layout))
    assert counts == pass_bytes(x.numel() * x.element_size(), residual)


def test_the_bandwidth_benchmark_times_every_pass_of_a_case(monkeypatch):
    # Its GPU timing (CUDA graphs, events) replaced by one call each: the passes' wiring, on CPU.
    import bn_bandwidth
    calls = []
    monkeypatch.setattr(bn_bandwidth, "graph_seconds", lambda fn, _calls, _trials: calls.append(fn()) or 2.0)
    monkeypatch.setattr(bn_bandwidth, "copy_seconds", lambda nbytes, _calls, _trials: 1.0)
    rows = bn_bandwidth.time_passes(bn_bandwidth.Case(2, 70, 6, True), torch.bfloat16, 1, 1, device="cpu")
    assert [r.name for r in rows] == ["stats", "apply", "grad stats", "input"] and len(calls) == 4
    assert calls[1].shape == (2, 70, 6, 6) and calls[3].shape == (2, 70, 6, 6)  # y, grad_x
    assert all(r.of_copy == 0.5 for r in rows) and "under 80%" in rows[0].line()
