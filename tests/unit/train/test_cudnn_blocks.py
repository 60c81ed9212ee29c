"""The cuDNN-frontend kernels' CPU-visible parts (ddp_train/fast/cudnn_blocks.py) and the probe that checks
them on a GPU (benchmarks/cudnn_fusion_probe.py): availability and its reasons, the graph cache key,
the libcudnn listing, the probe's shapes and command line. The kernels themselves need a GPU:
tests/unit/train/test_fused_blocks.py has the GPU test."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import cudnn_fusion_probe  # benchmarks/, on the path through pyproject.toml's pytest pythonpath
import pytest
import torch

from ddp_train.fast import cudnn_blocks, fused_blocks
from ddp_train.config import GPU_BATCH_PER_RANK

PROBE = Path(cudnn_fusion_probe.__file__).resolve()


@pytest.fixture
def no_cudnn(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # `import cudnn` raises ImportError


def fake_cudnn(monkeypatch, backend_version):
    module = types.ModuleType("cudnn")
    module.__version__ = "0.0-fake"
    module.backend_version = backend_version
    monkeypatch.setitem(sys.modules, "cudnn", module)


def test_the_module_imports_without_the_cudnn_package(no_cudnn):
    importlib.reload(cudnn_blocks)
    assert callable(cudnn_blocks.kernels)


def test_without_the_package_there_are_no_kernels_and_the_reason_says_what_to_install(no_cudnn):
    assert cudnn_blocks.kernels() is None
    assert "pip install nvidia-cudnn-frontend" in cudnn_blocks.unavailable_reason()


def test_a_frontend_without_its_libcudnn_is_unavailable_with_that_reason(monkeypatch):
    def no_library():
        raise RuntimeError("libcudnn.so: cannot open shared object file\nsecond line")
    fake_cudnn(monkeypatch, no_library)
    reason = cudnn_blocks.unavailable_reason()
    assert "no usable libcudnn" in reason and "cannot open shared object file" in reason
    assert "second line" not in reason and cudnn_blocks.kernels() is None


def test_a_working_frontend_without_a_gpu_is_unavailable_for_want_of_the_gpu(monkeypatch):
    fake_cudnn(monkeypatch, lambda: 92400)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cudnn_blocks.unavailable_reason() == "no CUDA GPU is visible"


def test_use_cudnn_kernels_leaves_the_reference_in_place_and_says_why(no_cudnn, monkeypatch):
    monkeypatch.setattr(fused_blocks, "KERNELS", {})
    line = cudnn_blocks.use_cudnn_kernels()
    assert line.startswith("fused blocks on cuda: the reference (") and "nvidia-cudnn-frontend" in line
    assert fused_blocks.KERNELS == {}


def test_use_cudnn_kernels_plugs_them_in_for_cuda_when_they_can_run(monkeypatch):
    monkeypatch.setattr(fused_blocks, "KERNELS", {})
    stand_in = fused_blocks.Kernels(fused_blocks.reference_conv_stats, fused_blocks.reference_conv_stats_backward,
                                    "cuDNN frontend (test stand-in)")
    monkeypatch.setattr(cudnn_blocks, "kernels", lambda: stand_in)
    assert cudnn_blocks.use_cudnn_kernels() == "fused blocks on cuda: cuDNN frontend (test stand-in)"
    assert fused_blocks.KERNELS == {"cuda": stand_in}
    fused_blocks.unplug("cuda")
    assert fused_blocks.KERNELS == {}


def tensors(layout=torch.channels_last, dtype=torch.bfloat16, cin=4):
    x = torch.zeros(2, cin, 6, 6, dtype=dtype).contiguous(memory_format=layout)
    w = torch.zeros(5, cin, 3, 3, dtype=dtype).contiguous(memory_format=layout)
    return {"x": x, "w": w}


def test_the_same_shapes_strides_and_dtype_share_one_graph():
    assert cudnn_blocks.graph_key("fprop", tensors(), 1) == cudnn_blocks.graph_key("fprop", tensors(), 1)


@pytest.mark.parametrize("change", ["layout", "dtype", "channels", "padding", "kind", "prologue"])
def test_anything_a_graph_is_built_for_gives_another_key(change):
    base = cudnn_blocks.graph_key("fprop", tensors(), 1)
    other = {
        "layout": lambda: cudnn_blocks.graph_key("fprop", tensors(layout=torch.contiguous_format), 1),
        "dtype": lambda: cudnn_blocks.graph_key("fprop", tensors(dtype=torch.float16), 1),
        "channels": lambda: cudnn_blocks.graph_key("fprop", tensors(cin=8), 1),
        "padding": lambda: cudnn_blocks.graph_key("fprop", tensors(), 0),
        "kind": lambda: cudnn_blocks.graph_key("dgrad", tensors(), 1),
        "prologue": lambda: cudnn_blocks.graph_key("fprop", {**tensors(), "scale": torch.ones(1, 4, 1, 1)}, 1),
    }[change]()
    assert other != base
    assert other.has_prologue == (change == "prologue") and not base.has_prologue


def test_a_key_refuses_tensors_on_two_devices():
    with pytest.raises(ValueError, match="several devices"):
        cudnn_blocks.graph_key("fprop", {**tensors(), "w": torch.zeros(1, device="meta")}, 1)


def test_inputs_the_graphs_are_not_built_for_run_the_reference(no_cudnn):
    # On CPU (and for fp32 or grouped convolutions anywhere) the kernels are the reference, without cudnn.
    torch.manual_seed(0)
    x, w = torch.randn(2, 4, 6, 6), torch.randn(5, 4, 3, 3)
    scale, bias = torch.rand(4) + 0.5, torch.randn(4)
    assert not cudnn_blocks.fusable(x, w, scale, bias)
    for got, want in zip(cudnn_blocks.conv_stats_forward(x, w, scale, bias, 1),
                         fused_blocks.reference_conv_stats(x, w, scale, bias, 1)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_libcudnn_files_lists_each_mapped_copy_once():
    # proc(5): address perms offset dev inode pathname; one library maps several segments.
    maps = "\n".join([
        "7f00-7f10 r--p 00000000 08:01 11 /venv/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "7f10-7f20 r-xp 00010000 08:01 11 /venv/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
        "7f20-7f30 r--p 00000000 08:01 12 /venv/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9",
        "7f30-7f40 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libcudnn.so.9.1.0",
        "7f40-7f50 rw-p 00000000 00:00 0 [heap]",
    ])
    assert cudnn_blocks.libcudnn_files(maps) == ("/usr/lib/x86_64-linux-gnu/libcudnn.so.9.1.0",
                                                 "/venv/site-packages/nvidia/cudnn/lib/libcudnn.so.9")


def test_the_probe_covers_each_distinct_fused_convolution_of_the_default_model():
    # Widths 16, 160, 320, 640 (model.scaled_widths at 1.0), sizes 32, 16, 8; per stage: conv1 of the
    # first block (width change), conv2 (the prologue's), conv1 of the second block.
    shapes = cudnn_fusion_probe.conv_shapes(cudnn_fusion_probe.default_model(), GPU_BATCH_PER_RANK)
    assert [(s.cin, s.cout, s.size, s.prologue) for s in shapes] == [
        (16, 160, 32, False), (160, 160, 32, True), (160, 160, 32, False),
        (160, 320, 16, False), (320, 320, 16, True), (320, 320, 16, False),
        (320, 640, 8, False), (640, 640, 8, True), (640, 640, 8, False)]
    assert {(s.batch, s.kernel, s.padding) for s in shapes} == {(GPU_BATCH_PER_RANK, 3, 1)}


def test_the_probes_help_needs_no_gpu():
    run = subprocess.run([sys.executable, str(PROBE), "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert all(flag in run.stdout for flag in ("--batch", "--shapes", "--json"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gets")
def test_the_probe_without_a_gpu_says_so_in_one_line_and_exits_2():
    run = subprocess.run([sys.executable, str(PROBE), "--shapes", "1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == "cudnn_fusion_probe: no CUDA GPU is visible; run it on a GPU node"


def test_probe_errors_are_relative_to_what_was_summed():
    expected = torch.tensor([1.0, -1.0, 4.0])
    assert cudnn_fusion_probe.relative_error(expected + 0.04, expected) == pytest.approx(0.01)
    assert cudnn_fusion_probe.relative_error(expected + 0.04, expected, torch.tensor([8.0])) == pytest.approx(0.005)
