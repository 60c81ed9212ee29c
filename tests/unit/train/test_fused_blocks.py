"""The fused residual block's custom ops (ddp_train/fast/fused_blocks.py), checked on CPU with their
reference implementation: torch's own op checks, numerical gradients, training equal to the plain
blocks, one op each in torch.compile's graphs, and plugged-in kernels that are really called."""

from __future__ import annotations


import pytest
import torch

from ddp_train.fast import fused_blocks
from ddp_train.fast.fused_blocks import FusedBasicBlock, Kernels, conv_stats, conv_stats_backward
from ddp_train.recipe.model import WideResNet
from compiled_graphs import compiled_step_graphs, op_count

BLOCKS = 6  # WideResNet: three stages of two blocks
WIDTH = 1 / 16


def op_inputs(dtype=torch.float64, prologue=True, kernel=3, channels_last=False, shape=(2, 4, 6, 6), out_channels=5):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    channels = shape[1]
    w = torch.randn(out_channels, channels, kernel, kernel, dtype=dtype)
    scale = torch.rand(channels, dtype=dtype) + 0.5 if prologue else None
    bias = torch.randn(channels, dtype=dtype) if prologue else None
    return [t.requires_grad_() if t is not None else None for t in (x, w, scale, bias)] + [kernel // 2]


@pytest.mark.parametrize("kwargs", [dict(), dict(prologue=False), dict(kernel=1), dict(channels_last=True),
                                    dict(dtype=torch.float32)])
def test_conv_stats_passes_torchs_custom_op_checks(kwargs):
    # Schema, fake (shape-only) version, autograd registration and AOT dispatch, as torch.compile uses them:
    # https://pytorch.org/docs/stable/library.html#torch.library.opcheck
    torch.library.opcheck(conv_stats, op_inputs(**kwargs))


def test_conv_stats_backward_passes_torchs_custom_op_checks():
    x, w, scale, bias, padding = op_inputs()
    y, total, sq_total = conv_stats(x, w, scale, bias, padding)
    grads = [torch.randn_like(t) for t in (y, total, sq_total)]
    torch.library.opcheck(conv_stats_backward, [*grads, x.detach(), w.detach(), scale.detach(), bias.detach(),
                                                y.detach(), padding])


@pytest.mark.parametrize("prologue", [True, False])
def test_conv_stats_gradients_match_numerical_derivatives(prologue):
    # Through all three outputs: the statistics' gradients reach x, w, scale and bias too. gradcheck takes
    # two evaluations per input element and a backward per output element: the smallest inputs that keep a
    # batch, several channels each way and a border for the padding (1x3x5x5 into 2: about 10x fewer).
    x, w, scale, bias, padding = op_inputs(prologue=prologue, shape=(1, 3, 5, 5), out_channels=2)
    inputs = tuple(t for t in (x, w, scale, bias) if t is not None)
    if prologue:
        assert torch.autograd.gradcheck(lambda *t: conv_stats(*t, padding), inputs)
    else:
        assert torch.autograd.gradcheck(lambda *t: conv_stats(*t, None, None, padding), inputs)


def twin_models(dtype):
    torch.manual_seed(0)
    plain = WideResNet(10, WIDTH, 0.0).to(dtype)
    fused = WideResNet(10, WIDTH, 0.0, block=FusedBasicBlock).to(dtype)
    fused.load_state_dict(plain.state_dict())  # the same state dict: checkpoints carry over
    return plain, fused


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)


def test_fused_model_trains_exactly_like_the_plain_one_over_several_steps():
    # float64: rounding differences stay at 1e-13, where a ReLU or max-pool decision never flips. In
    # float32 one flip at a ReLU's zero (about 1 in 10^5 values here) sends two tiny random-label
    # models apart within a few steps, whatever the two implementations.
    plain, fused = twin_models(torch.float64)
    opt_plain, opt_fused = sgd(plain), sgd(fused)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    for _ in range(4):
        x, y = torch.randn(16, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (16,))
        loss_plain, loss_fused = criterion(plain(x), y), criterion(fused(x), y)
        loss_plain.backward()
        loss_fused.backward()
        torch.testing.assert_close(loss_fused, loss_plain, rtol=1e-10, atol=0)
        for (name, p), f in zip(plain.named_parameters(), fused.parameters()):
            torch.testing.assert_close(f.grad, p.grad, rtol=1e-8, atol=1e-12, msg=f"gradient of {name}")
        for opt in (opt_plain, opt_fused):
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (name, p), f in zip(plain.state_dict().items(), fused.state_dict().values()):
        torch.testing.assert_close(f, p, rtol=1e-8, atol=1e-12, msg=f"{name} after 4 steps")  # running stats too
    plain.eval()
    fused.eval()
    x = torch.randn(8, 3, 32, 32, dtype=torch.float64)
    torch.testing.assert_close(fused(x), plain(x), rtol=1e-8, atol=1e-12)


def flat_grads(model):
    return torch.cat([p.grad.double().flatten() for p in model.parameters()])


def bf16_errors(plain, fused, truth, x, y):
    """Loss and gradients of plain and fused under bf16 autocast, each as its relative distance
    from the float64 truth: bf16 gradients of a small model are 30-70% off per tensor, so the
    question is whether the fused blocks' error is larger than the plain blocks'."""
    for model in (plain, fused, truth):
        model.zero_grad(set_to_none=True)
    loss_truth = torch.nn.functional.cross_entropy(truth(x.double()), y)
    loss_truth.backward()
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        losses = {"plain": torch.nn.functional.cross_entropy(plain(x), y),
                  "fused": torch.nn.functional.cross_entropy(fused(x), y)}
    errors = {}
    for name, model in (("plain", plain), ("fused", fused)):
        losses[name].backward()
        errors[name] = ((flat_grads(model) - flat_grads(truth)).norm() / flat_grads(truth).norm()).item()
        errors[f"{name} loss"] = abs(losses[name].item() - loss_truth.item()) / loss_truth.item()
    return errors


def test_under_bf16_autocast_the_ops_run_in_bf16_no_further_from_the_truth_than_the_plain_blocks(monkeypatch):
    # The GPU path's precision, on CPU. Autocast does not cast custom ops: the block does.
    plain, fused = twin_models(torch.float32)
    truth = WideResNet(10, WIDTH, 0.0).double()
    truth.load_state_dict(plain.state_dict())
    seen = []
    reference = fused_blocks.reference_conv_stats
    monkeypatch.setitem(fused_blocks.KERNELS, "cpu", Kernels(lambda *a: seen.append(a[0].dtype) or reference(*a),
                                                             fused_blocks.reference_conv_stats_backward,
                                                             "test: dtype probe"))
    errors = bf16_errors(plain, fused, truth, torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))
    assert set(seen) == {torch.bfloat16} and len(seen) == 2 * BLOCKS
    assert all(p.grad.dtype == torch.float32 for p in fused.parameters())
    assert errors["fused loss"] < 2e-2 and errors["fused"] < 1.5 * errors["plain"], errors


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA path of the fused blocks needs a CUDA GPU")
def test_on_the_gpu_fused_blocks_train_within_bf16_tolerance_of_the_plain_ones_over_several_steps():
    # Whatever KERNELS["cuda"] holds (the reference unless a test plugs the cuDNN kernels in).
    several_bf16_steps_on_the_gpu()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cuDNN kernels of the fused blocks need a CUDA GPU")
def test_on_the_gpu_the_cudnn_kernels_train_within_bf16_tolerance_of_the_plain_blocks(monkeypatch):
    from ddp_train.fast import cudnn_blocks
    kernels = cudnn_blocks.kernels()
    if kernels is None:
        pytest.skip(f"the cuDNN kernels cannot run here: {cudnn_blocks.unavailable_reason()}")
    monkeypatch.setitem(fused_blocks.KERNELS, "cuda", kernels)
    monkeypatch.setattr(cudnn_blocks, "GRAPHS", {})
    several_bf16_steps_on_the_gpu()
    # cuDNN graphs ran, not the reference that a declined graph falls back to.
    built = {key.kind for key, entry in cudnn_blocks.GRAPHS.items() if isinstance(entry, cudnn_blocks.Built)}
    assert built == {"fprop", "dgrad", "wgrad"}, cudnn_blocks.decisions()


def several_bf16_steps_on_the_gpu():
    # channels_last and bf16 autocast as the trainer runs them; each step from the same weights.
    cuda = torch.device("cuda")
    layout = dict(memory_format=torch.channels_last)
    torch.manual_seed(0)
    plain = WideResNet(100, 0.25, 0.0).to(cuda, **layout)
    fused = WideResNet(100, 0.25, 0.0, block=FusedBasicBlock).to(cuda, **layout)
    truth = WideResNet(100, 0.25, 0.0).to(cuda, torch.float64, **layout)
    optimizer = sgd(plain)
    for step in range(4):
        fused.load_state_dict(plain.state_dict())
        truth.load_state_dict(plain.state_dict())
        x = torch.randn(128, 3, 32, 32, device=cuda).contiguous(**layout)
        errors = bf16_errors(plain, fused, truth, x, torch.randint(0, 100, (128,), device=cuda))
        assert errors["fused loss"] < 2e-2 and errors["fused"] < 1.5 * errors["plain"], (step, errors)
        optimizer.step()


def test_torch_compile_sees_one_op_per_convolution_forward_and_backward():
    plain, fused = twin_models(torch.float64)
    x = torch.randn(8, 3, 32, 32, dtype=torch.float64)
    graphs = compiled_step_graphs(fused, x)  # fullgraph: no graph break
    plain(x).square().mean().backward()
    assert op_count(graphs["forward"], torch.ops.ddp_train.conv_stats.default) == 2 * BLOCKS
    assert op_count(graphs["backward"], torch.ops.ddp_train.conv_stats_backward.default) == 2 * BLOCKS
    for (name, p), f in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(f.grad, p.grad, rtol=1e-8, atol=1e-12, msg=f"compiled gradient of {name}")


def test_a_plugged_in_kernel_runs_in_place_of_the_reference(monkeypatch):
    calls = {"forward": 0, "backward": 0}

    def counted(name, fn):
        def run(*args):
            calls[name] += 1
            return fn(*args)
        return run
    monkeypatch.setitem(fused_blocks.KERNELS, "cpu", Kernels(
        counted("forward", fused_blocks.reference_conv_stats),
        counted("backward", fused_blocks.reference_conv_stats_backward), "test: counting"))
    _, fused = twin_models(torch.float32)
    fused(torch.randn(4, 3, 32, 32)).sum().backward()
    assert calls == {"forward": 2 * BLOCKS, "backward": 2 * BLOCKS}


def test_a_fused_block_refuses_dropout_it_cannot_place():
    with pytest.raises(ValueError, match="use dropout 0"):
        FusedBasicBlock(4, 4, dropout=0.01)
