"""Our Triton BatchNorm (ddp_train/fast/bn_kernels.py, bn_blocks.py): the kernels against nn.BatchNorm2d under
Triton's interpreter (bn_interpreter_cases.py, in a process of its own), every kernel through Triton's
own compiler for the clusters' GPUs (no GPU needed), the tiling plan, the --bn-kernels lever and its
errors, and on a GPU the compiled kernels at the model's shapes and in a compiled training step with
CUDA graphs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from train_helpers import TINY_ARGS, run_trainer, trainer_env
from ddp_train.fast import bn_kernels, cudagraph_report, levers, speed
from ddp_train.fast.bn_blocks import TritonBasicBlock, batch_norm_act, block_for
from ddp_train.config import GPU_BATCH_PER_RANK, config_from_args
from ddp_train.errors import TrainError
from ddp_train.recipe.model import BasicBlock, WideResNet

ROOT = Path(__file__).resolve().parents[3]
CASES = Path(__file__).with_name("bn_interpreter_cases.py")
CHANNELS_LAST = dict(memory_format=torch.channels_last)


def test_the_kernels_match_batchnorm2d_under_tritons_interpreter():
    # About a minute of CPU: the interpreter runs every program of every kernel in Python.
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)], cwd=ROOT,
                          env=trainer_env(TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.fullmatch(r"=* ?(\d+) passed in .*", summary)
    assert passed and int(passed.group(1)) >= 30, summary  # every case ran: none skipped, none left out


@pytest.mark.parametrize("batch, channels, size", [(GPU_BATCH_PER_RANK, 160, 32), (GPU_BATCH_PER_RANK, 320, 16),
                                                   (GPU_BATCH_PER_RANK, 640, 8)])
def test_the_models_activations_tile_without_idle_lanes_in_about_a_thousand_programs(batch, channels, size):
    layout = bn_kernels.plan(batch * size * size, channels)
    assert channels % layout.block_c == 0 and layout.block_m * layout.block_c == bn_kernels.TILE
    assert layout.rows_per_program % layout.block_m == 0
    assert (layout.partials - 1) * layout.rows_per_program < layout.rows <= layout.partials * layout.rows_per_program
    assert bn_kernels.TARGET_PROGRAMS // 2 < layout.partials * layout.column_blocks <= bn_kernels.TARGET_PROGRAMS


def test_channels_no_block_divides_are_covered_by_masked_blocks():
    layout = bn_kernels.plan(300, 70)
    assert (layout.block_c, layout.column_blocks, layout.block_m, layout.partials) == (64, 2, 64, 5)
    assert bn_kernels.plan(42, 5).block_c == 8


def test_the_kernels_refuse_cpu_tensors_outside_the_interpreter_naming_it(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        bn_kernels.check_input(torch.zeros(2, 3, 4, 4).contiguous(**CHANNELS_LAST))


def test_bn_kernels_auto_is_torch_everywhere_until_a_gpu_measurement_says_otherwise():
    assert config_from_args([]).bn_kernels == "auto"
    assert levers.resolve_bn_kernels("auto", "cuda") == levers.BN_CUDA_DEFAULT == "torch"
    assert levers.resolve_bn_kernels("auto", "cpu") == "torch"
    assert levers.resolve_bn_kernels("triton", "cuda") == "triton"
    assert block_for("torch") is BasicBlock and block_for("triton") is TritonBasicBlock


def test_triton_on_a_cpu_run_is_one_line_naming_the_fix():
    with pytest.raises(TrainError) as raised:
        levers.resolve_bn_kernels("triton", "cpu")
    assert "needs a CUDA GPU" in str(raised.value) and "--bn-kernels torch" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_trainer_on_cpu_refuses_triton_batchnorm_with_exit_2_and_one_line(ten_class_data, tmp_path):
    result = run_trainer(["--data-dir", str(ten_class_data), "--run-dir", str(tmp_path), *TINY_ARGS,
                          "--epochs", "1", "--bn-kernels", "triton"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "ddp-train: error: --bn-kernels triton needs a CUDA GPU and this run is on cpu (Triton compiles for GPUs; "
        "on a CPU it only interprets, for tests): use --bn-kernels torch"]


def test_without_the_triton_package_the_block_is_a_one_line_error_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    with pytest.raises(TrainError, match=r"triton package is not importable .*pip install triton"):
        block_for("triton")


def test_the_warm_up_line_names_our_batchnorm_when_it_runs():
    fast = speed.FastModel(torch.nn.Identity(), lambda x: x, True, "reduce-overhead", True, None, ("pdl",), "triton")
    assert fast.describe() == "reduce-overhead + pdl + triton BatchNorm"
    assert speed.FastModel(torch.nn.Identity(), lambda x: x, False, "eager", False).describe() == "eager"


def test_the_triton_block_keeps_the_plain_blocks_state_dict_and_refuses_a_cumulative_average():
    torch.manual_seed(0)
    plain = WideResNet(10, 1 / 16, 0.0)
    ours = WideResNet(10, 1 / 16, 0.0, block=TritonBasicBlock)
    assert list(ours.state_dict()) == list(plain.state_dict())
    block = TritonBasicBlock(4, 4, 0.0)
    block.bn1.momentum = None
    with pytest.raises(ValueError, match="momentum"):
        batch_norm_act(torch.zeros(2, 4, 3, 3), block.bn1)


# --- on a GPU -------------------------------------------------------------------------------------

NO_GPU = "no CUDA device: the compiled Triton kernels need a GPU"


def relative_error(got, want):
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("residual", [True, False], ids=["relu+add", "relu"])
@pytest.mark.parametrize("channels, size", [(160, 32), (320, 16), (640, 8)])
def test_on_the_gpu_the_kernels_match_batchnorm2d_at_the_models_shapes(channels, size, residual, dtype):
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    shape = (256, channels, size, size)
    ours, reference = torch.nn.BatchNorm2d(channels).to(cuda), torch.nn.BatchNorm2d(channels).to(cuda)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.normal_()
    reference.load_state_dict(ours.state_dict())
    x = (torch.randn(shape, device=cuda) * 2 + 3).to(dtype).contiguous(**CHANNELS_LAST).requires_grad_()
    res = torch.randn(shape, device=cuda).to(dtype).contiguous(**CHANNELS_LAST).requires_grad_() if residual else None
    grad_y = torch.randn(shape, device=cuda).to(dtype).contiguous(**CHANNELS_LAST)
    y = batch_norm_act(x, ours, res)
    y.backward(grad_y)
    x32 = x.detach().float().requires_grad_()
    res32 = res.detach().float().requires_grad_() if residual else None
    want = torch.relu(reference(x32) + (res32 if residual else 0))
    want.backward(grad_y.float())
    step = 2 ** -8 if dtype == torch.bfloat16 else 2 ** -11  # one rounding of the activation dtype
    assert relative_error(y, want) < 2 * step and relative_error(x.grad, x32.grad) < 4 * step
    if residual:
        assert relative_error(res.grad, res32.grad) < 2 * step
    assert relative_error(ours.weight.grad, reference.weight.grad) < 1e-4
    assert relative_error(ours.bias.grad, reference.bias.grad) < 1e-4
    assert relative_error(ours.running_var, reference.running_var) < 1e-5


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_on_the_gpu_a_compiled_step_with_graphs_and_triton_blocks_trains_like_the_plain_blocks():
    # The trainer's CUDA path: channels_last, bf16 autocast, reduce-overhead (CUDA graphs); each step
    # from the same weights, both no further from a float64 truth than bf16 allows.
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    plain = WideResNet(100, 0.25, 0.0).to(cuda, **CHANNELS_LAST)
    ours = WideResNet(100, 0.25, 0.0, block=TritonBasicBlock).to(cuda, **CHANNELS_LAST)
    truth = WideResNet(100, 0.25, 0.0).to(cuda, torch.float64, **CHANNELS_LAST)
    watch = cudagraph_report.SkipWatch.start()
    compiled = torch.compile(ours, mode="reduce-overhead")
    try:
        for step in range(4):
            ours.load_state_dict(plain.state_dict())
            truth.load_state_dict(plain.state_dict())
            x = torch.randn(128, 3, 32, 32, device=cuda).contiguous(**CHANNELS_LAST)
            y = torch.randint(0, 100, (128,), device=cuda)
            errors = {}
            for model in (plain, ours, truth):
                model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(truth(x.double()), y).backward()
            want = torch.cat([p.grad.flatten() for p in truth.parameters()])
            for name, model, forward in (("plain", plain, plain), ("ours", ours, compiled)):
                torch.compiler.cudagraph_mark_step_begin()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = torch.nn.functional.cross_entropy(forward(x), y)
                loss.backward()
                got = torch.cat([p.grad.double().flatten() for p in model.parameters()])
                errors[name] = ((got - want).norm() / want.norm()).item()
            assert errors["ours"] < 1.5 * errors["plain"], (step, errors)
        state = cudagraph_report.observe("cuda", torch.cuda.current_device(), True, "reduce-overhead", watch)
        assert state.state == "on", state.text()
    finally:
        watch.stop()
        torch._dynamo.reset()


# --- Triton's compiler, without a GPU -------------------------------------------------------------

ACTIVATIONS = {"x_ptr", "residual_ptr", "y_ptr", "grad_y_ptr", "g_ptr", "grad_x_ptr"}  # the rest: fp32 vectors
SCALARS = {"rows": "i32", "channels": "i32", "rows_per_program": "i32", "partials": "i32", "eps": "fp32"}
BLOCKS_160 = dict(BLOCK_M=bn_kernels.TILE // 32, BLOCK_C=32)  # bn_kernels.plan for 160 channels
FINAL = dict(BLOCK_P=bn_kernels.FINAL_BLOCK_P, BLOCK_C=bn_kernels.FINAL_BLOCK_C)
# Every kernel with every flag set the ops launch it with (bn_kernels.forward and backward, ReLU on
# as in the model, with and without a residual).
LAUNCHES = [(bn_kernels.stats_partials, BLOCKS_160), (bn_kernels.stats_finalize, FINAL),
            (bn_kernels.grad_finalize, FINAL),
            *((bn_kernels.apply, dict(HAS_RESIDUAL=residual, RELU=True, **BLOCKS_160)) for residual in (False, True)),
            *((bn_kernels.grad_partials, dict(RELU=True, WRITE_G=residual, **BLOCKS_160)) for residual in (False, True)),
            *((bn_kernels.grad_input, dict(RELU=not residual, **BLOCKS_160)) for residual in (False, True))]


def signature(kernel, constexprs) -> dict[str, str]:
    """Each argument's Triton type, as a launch with bf16 activations gives them."""
    def kind(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        if name.endswith("_ptr"):
            return "*bf16" if name in ACTIVATIONS else "*fp32"
        return SCALARS[name]
    return {name: kind(name) for name in kernel.arg_names}


@pytest.mark.parametrize("backend, arch, warp_size, binary", [("cuda", 90, 32, "cubin"), ("cuda", 80, 32, "cubin"),
                                                               ("hip", "gfx90a", 64, "hsaco")],
                         ids=["H100 and GH200 (sm_90)", "A100 (sm_80)", "MI250X (gfx90a)"])
def test_every_kernel_compiles_to_a_gpu_binary_with_tritons_own_compiler(backend, arch, warp_size, binary,
                                                                         monkeypatch, tmp_path):
    # The interpreter runs Python, not Triton's compiler: this compiles each launch for the clusters'
    # GPUs (triton.compile with an explicit target needs no GPU; triton/compiler/compiler.py).
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    for kernel, constexprs in LAUNCHES:
        compiled = triton.compile(ASTSource(kernel, signature(kernel, constexprs), constexprs),
                                  target=GPUTarget(backend, arch, warp_size), options={"num_warps": bn_kernels.NUM_WARPS})
        assert compiled.asm.get(binary), f"{kernel.__name__} {constexprs}: no {binary}"
