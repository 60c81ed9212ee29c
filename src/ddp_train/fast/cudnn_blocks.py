"""cuDNN-frontend kernels for the fused blocks' two ops (ddp_train.fast.fused_blocks): cuDNN graphs built
once per shape, plugged in for "cuda" by use_cudnn_kernels() here, a default nowhere.

Written against nvidia-cudnn-frontend 1.32.0 (`cudnn.pygraph`, `cudnn.create_handle`,
`cudnn.set_stream(handle, stream)`, read in the wheel's own cudnn/__init__.py and _pygraph.py); the
graphs follow https://github.com/NVIDIA/cudnn-frontend/blob/main/test/python/test_conv_genstats.py,
test/python/test_wgrads.py and samples/cpp/convolution/{dgrads,wgrads}.cpp. What runs where:

    forward   scale -> bias -> relu -> conv_fprop -> genstats, one graph (the "ConvScaleBiasRelu
              Genstats" fusion of test_conv_genstats.py); without scale and bias, conv_fprop -> genstats.
    backward  the incoming gradient plus the statistics' gradients (grad_y + grad_sum + 2 y grad_sq_sum,
              per channel) in torch: cuDNN has no dgrad/wgrad prologue that takes it. Then one graph
              conv_dgrad, and one graph scale -> bias -> relu -> conv_wgrad (wgrads.cpp,
              "scale-bias-relu-wgrad"). The ReLU's backward stays in torch: a conv_dgrad -> relu_backward
              graph (the "Dgrad Drelu" graph of dgrads.cpp) gave wrong gradients on an H100 (RECIPES).
              The BatchNorm-weight reduction of "Dgrad Drelu DBNweight" (dbn_weight) is not in the
              Python API (1.32 has no pygraph.dbn_weight), so grad_scale, grad_bias and
              grad_x = grad_pre * scale are torch on the dgrad graph's output.

Each graph has fallbacks, tried in order when cuDNN declines one (check_support or build_plans
raises): the prologue in torch and the rest in the graph, then the bare convolution with the rest in
torch. A shape where every recipe is declined runs the reference; `decisions()` says which recipe
each shape got and why the others were declined (the probe prints it).

libcudnn: `import cudnn` dlopens the backend itself (cudnn/__init__.py, _dlopen_cudnn): first
libcudnn.so.9 in $LD_LIBRARY_PATH, then sysconfig's purelib/nvidia/cudnn/lib/libcudnn.so.*, which is
where nvidia-cudnn-cu13 puts it and where torch's CUDA wheel loads it from, then the soname, which
the dynamic linker answers with the copy already loaded. Torch is imported and its cuDNN loaded first
(torch.backends.cudnn.version()), so both use one library; `libcudnn_files()` lists the copies that
are mapped, to show it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Union

import torch
from torch import Tensor

from ddp_train.fast.fused_blocks import (CHANNELS, Kernels, _prologue, plug_in, reference_conv_stats,
                                    reference_conv_stats_backward)

INSTALL_HINT = "pip install nvidia-cudnn-frontend"
FUSED_DTYPES = (torch.bfloat16, torch.float16)  # the fusion engines' I/O types; others run the reference
NHWC = torch.channels_last  # the fusion engines' layout (cuDNN's runtime fusion is NHWC-only)


# --- availability ---------------------------------------------------------------------------------

def _import_cudnn() -> Any:
    torch.backends.cudnn.version()  # torch's libcudnn first: the frontend's dlopen then finds that one
    import cudnn
    return cudnn


def unavailable_reason() -> str:
    """Why the cuDNN kernels cannot run here, or "" when they can."""
    try:
        cudnn = _import_cudnn()
    except ImportError as exc:
        return f"the cuDNN frontend's Python package is not importable ({exc}): {INSTALL_HINT}"
    except Exception as exc:  # a broken install: the compiled module or its dlopen failed
        return f"importing cudnn failed: {type(exc).__name__}: {first_line(exc)}"
    try:
        backend = int(cudnn.backend_version())
    except Exception as exc:
        return (f"cudnn {getattr(cudnn, '__version__', '?')} found no usable libcudnn "
                f"({type(exc).__name__}: {first_line(exc)}): install nvidia-cudnn-cu13, the one torch uses")
    if backend <= 0:
        return f"cudnn {getattr(cudnn, '__version__', '?')} reports libcudnn version {backend}: no backend loaded"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible"
    return ""


def kernels() -> Optional[Kernels]:
    """The cuDNN implementations of both ops, or None (unavailable_reason() says why)."""
    if unavailable_reason():
        return None
    cudnn = _import_cudnn()
    return Kernels(conv_stats_forward, conv_stats_backward,
                   f"cuDNN frontend {cudnn.__version__} graphs, libcudnn {cudnn.backend_version()}")


def use_cudnn_kernels() -> str:
    """Plug the cuDNN-frontend kernels in for "cuda" where they can run; one line saying what
    the CUDA path now runs, either way. Here, not in fused_blocks: that module is the reference and
    the seam, and knows no implementation (this one imports it, never the other way round)."""
    found = kernels()
    if found is None:
        return f"fused blocks on cuda: the reference ({unavailable_reason()})"
    plug_in("cuda", found)
    return f"fused blocks on cuda: {found.source}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


LIBCUDNN = re.compile(r"(/\S*/libcudnn\.so[.\d]*)$")


def libcudnn_files(maps: str) -> tuple[str, ...]:
    """The distinct libcudnn.so files mapped into a process, from the text of /proc/<pid>/maps
    (proc(5): the pathname is the last field). Two paths mean two copies of the library."""
    found = {m.group(1) for line in maps.splitlines() if (m := LIBCUDNN.search(line.strip()))}
    return tuple(sorted(found))


# --- the graph cache ------------------------------------------------------------------------------

Layout = tuple[tuple[int, ...], tuple[int, ...], str]  # shape, strides, dtype


def layout_of(t: Tensor) -> Layout:
    return tuple(t.shape), tuple(t.stride()), str(t.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class GraphKey:
    """What a built graph depends on: the step (fprop, dgrad, wgrad), every bound tensor's shape,
    strides and dtype (scale present: the prologue), the padding and the device. Every training
    step has the same key, so a graph is built once per distinct convolution."""
    kind: str
    layouts: tuple[tuple[str, Layout], ...]
    padding: int
    device: str

    @property
    def has_prologue(self) -> bool:
        return any(role == "scale" for role, _ in self.layouts)


def graph_key(kind: str, tensors: Mapping[str, Tensor], padding: int) -> GraphKey:
    devices = {str(t.device) for t in tensors.values()}
    if len(devices) != 1:
        raise ValueError(f"the {kind} graph's tensors are on several devices: {sorted(devices)}")
    return GraphKey(kind, tuple(sorted((role, layout_of(t)) for role, t in tensors.items())), padding,
                    devices.pop())


@dataclass(frozen=True)
class Recipe:
    """One way to build a step's graph: `fuses` names what the graph does beyond the convolution
    ("prologue": scale, bias, relu on x; "stats": genstats), the rest
    is torch. `build(graph, tensor, key)` declares the graph; `tensor(role)` declares an input with
    the layout of the buffer bound to that role, `tensor(role, node_output)` makes an output of it."""
    name: str
    fuses: frozenset[str]
    build: Callable[..., None]


@dataclass(frozen=True)
class Built:
    recipe: Recipe
    graph: Any
    tensors: dict[str, Any]  # role -> cudnn tensor, every one the graph binds
    workspace_size: int
    declined: tuple[str, ...]  # the recipes tried before it, each with cuDNN's reason


@dataclass(frozen=True)
class Declined:
    reasons: tuple[str, ...]


GRAPHS: dict[GraphKey, Union[Built, Declined]] = {}
HANDLES: dict[str, Any] = {}


def decisions() -> list[str]:
    """One line per graph built or declined so far: the key's step and shapes, the recipe."""
    lines = []
    for key, entry in GRAPHS.items():
        shapes = ", ".join(f"{role} {list(layout[0])}" for role, layout in key.layouts if role in ("x", "w"))
        if isinstance(entry, Built):
            tried = f" (declined first: {'; '.join(entry.declined)})" if entry.declined else ""
            lines.append(f"{key.kind} {shapes} pad {key.padding}: {entry.recipe.name}{tried}")
        else:
            lines.append(f"{key.kind} {shapes} pad {key.padding}: reference ({'; '.join(entry.reasons)})")
    return lines


def recipe_for(key: GraphKey) -> Optional[str]:
    entry = GRAPHS.get(key)
    return entry.recipe.name if isinstance(entry, Built) else None


def _handle(device: torch.device) -> Any:
    cudnn = _import_cudnn()
    name = str(device)
    if name not in HANDLES:
        with torch.cuda.device(device):  # a handle is bound to the device current at its creation
            HANDLES[name] = cudnn.create_handle()
    handle = HANDLES[name]
    # torch's current stream, so the graphs order with torch's kernels (and CUDA-graph capture).
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(device).cuda_stream)
    return handle


CUDNN_TYPES = {"bfloat16": "BFLOAT16", "float16": "HALF", "float32": "FLOAT"}


def _build(recipe: Recipe, key: GraphKey, intermediate: str, handle: Any) -> Built:
    cudnn = _import_cudnn()
    layouts = dict(key.layouts)
    io = getattr(cudnn.data_type, CUDNN_TYPES[layouts["w"][2]])
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=getattr(cudnn.data_type, intermediate),
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)

    declared: dict[str, Any] = {}

    def tensor(role: str, source: Optional[Any] = None) -> Any:
        """The input bound to `role`, or, given the node output `source`, that output made a graph
        output with the bound buffer's dims, strides and type."""
        if role in declared and source is None:
            return declared[role]
        shape, stride, dtype = layouts[role]
        data_type = getattr(cudnn.data_type, CUDNN_TYPES[dtype])
        if source is None:
            declared[role] = graph.tensor(name=role, dim=list(shape), stride=list(stride), data_type=data_type)
        else:
            declared[role] = (source.set_output(True).set_dim(list(shape)).set_stride(list(stride))
                              .set_data_type(data_type))
        return declared[role]

    recipe.build(graph, tensor, key)
    # The build sequence of the samples: heuristics A, then FALLBACK's plans.
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    return Built(recipe, graph, declared, int(graph.get_workspace_size()), ())


def _graph(key: GraphKey, recipes: tuple[tuple[Recipe, str], ...], device: torch.device) -> Union[Built, Declined]:
    """The cached graph for `key`: the first recipe cuDNN builds, or Declined with every reason."""
    entry = GRAPHS.get(key)
    if entry is None:
        handle = _handle(device)
        reasons: list[str] = []
        for recipe, intermediate in recipes:
            try:
                built = _build(recipe, key, intermediate, handle)
            except Exception as exc:  # cudnnGraphNotSupportedError, or a validate/build error
                reasons.append(f"{recipe.name}: {type(exc).__name__}: {first_line(exc)}")
                continue
            entry = Built(built.recipe, built.graph, built.tensors, built.workspace_size, tuple(reasons))
            break
        else:
            entry = Declined(tuple(reasons))
        GRAPHS[key] = entry
    return entry


def _execute(built: Built, buffers: Mapping[str, Tensor], device: torch.device) -> None:
    handle = _handle(device)
    # torch's caching allocator: stream-ordered, and part of the graph pool under CUDA-graph capture.
    workspace = torch.empty(built.workspace_size, dtype=torch.uint8, device=device)
    built.graph.execute({t: buffers[role] for role, t in built.tensors.items()}, workspace, handle=handle)


# --- the recipes ----------------------------------------------------------------------------------
# Roles: x (the op's input), image (the convolution's input made in torch: relu(x * scale + bias),
# or x), w, scale and bias (as [1, C, 1, 1]), y, sum and sq_sum (as [1, K, 1, 1]), dy (the combined
# incoming gradient), dx (the dgrad graph's output), dw.

def _conv_args(key: GraphKey) -> dict[str, list[int]]:
    return dict(padding=[key.padding] * 2, stride=[1, 1], dilation=[1, 1])


def _prologue_nodes(graph: Any, tensor: Callable[..., Any]) -> Any:
    """scale -> bias -> relu on x: test_conv_genstats.py's prologue."""
    scaled = graph.scale(name="scale", input=tensor("x"), scale=tensor("scale"))
    return graph.relu(name="relu", input=graph.bias(name="bias", input=scaled, bias=tensor("bias")))


def _fprop(prologue: bool, stats: bool) -> Callable[..., None]:
    def build(graph: Any, tensor: Callable[..., Any], key: GraphKey) -> None:
        image = _prologue_nodes(graph, tensor) if prologue else tensor("image")
        out = tensor("y", graph.conv_fprop(name="conv_fprop", image=image, weight=tensor("w"), **_conv_args(key)))
        if stats:
            total, sq_total = graph.genstats(name="genstats", input=out)
            tensor("sum", total)
            tensor("sq_sum", sq_total)
    return build


def _dgrad() -> Callable[..., None]:
    def build(graph: Any, tensor: Callable[..., Any], key: GraphKey) -> None:
        grad_a = graph.conv_dgrad(name="conv_dgrad", loss=tensor("dy"), filter=tensor("w"), **_conv_args(key))
        grad_a.set_dim(list(dict(key.layouts)["dx"][0]))  # as dgrads.cpp: dgrad's output dims are set
        tensor("dx", grad_a)
    return build


def _wgrad(prologue: bool) -> Callable[..., None]:
    def build(graph: Any, tensor: Callable[..., Any], key: GraphKey) -> None:
        image = _prologue_nodes(graph, tensor) if prologue else tensor("image")
        tensor("dw", graph.conv_wgrad(name="conv_wgrad", image=image, loss=tensor("dy"), **_conv_args(key)))
    return build


def _recipe(name: str, fuses: str, build: Callable[..., None]) -> Recipe:
    return Recipe(name, frozenset(fuses.split()), build)


# (recipe, intermediate data type): each as its sample sets it (HALF there, the io type here).
RECIPES: dict[tuple[str, bool], tuple[tuple[Recipe, str], ...]] = {
    ("fprop", True): ((_recipe("scale-bias-relu-conv-genstats", "prologue stats", _fprop(True, True)), "io"),
                      (_recipe("conv-genstats", "stats", _fprop(False, True)), "io"),
                      (_recipe("conv", "", _fprop(False, False)), "FLOAT")),
    ("fprop", False): ((_recipe("conv-genstats", "stats", _fprop(False, True)), "io"),
                       (_recipe("conv", "", _fprop(False, False)), "FLOAT")),
    # The dgrad -> relu_backward graphs are left out: on an H100 with cuDNN 9.19 (frontend 1.32) cuDNN
    # built "dgrad-scale-bias-drelu" for every prologue shape of the model, and its grad_x was 60-67%
    # off the reference (benchmarks/cudnn_fusion_probe.py, docs/benchmarks.md). Whether the graph or
    # the engine is at fault is not known, so the ReLU's backward stays in torch after a plain dgrad.
    ("dgrad", True): ((_recipe("dgrad", "", _dgrad()), "FLOAT"),),
    ("dgrad", False): ((_recipe("dgrad", "", _dgrad()), "FLOAT"),),
    ("wgrad", True): ((_recipe("scale-bias-relu-wgrad", "prologue", _wgrad(True)), "FLOAT"),
                      (_recipe("wgrad", "", _wgrad(False)), "FLOAT")),
    ("wgrad", False): ((_recipe("wgrad", "", _wgrad(False)), "FLOAT"),),
}


def _recipes(kind: str, prologue: bool, io: torch.dtype) -> tuple[tuple[Recipe, str], ...]:
    io_name = CUDNN_TYPES[str(io).removeprefix("torch.")]
    return tuple((r, io_name if t == "io" else t) for r, t in RECIPES[(kind, prologue)])


def _key_tensors(bound: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The tensors any recipe may bind ("image", made from x in torch, has x's layout)."""
    return {**bound, "image": bound["x"]}


# --- the ops --------------------------------------------------------------------------------------

def fusable(x: Tensor, weight: Tensor, scale: Optional[Tensor], bias: Optional[Tensor]) -> bool:
    """Inputs the graphs are built for: CUDA, 4-D, bf16 or fp16 throughout, one group."""
    if x.device.type != "cuda" or x.dim() != 4 or weight.dim() != 4 or x.dtype not in FUSED_DTYPES:
        return False
    if weight.dtype != x.dtype or weight.shape[1] != x.shape[1] or weight.device != x.device:
        return False
    return all(t is None or (t.dtype == x.dtype and t.shape == (x.shape[1],)) for t in (scale, bias))


def _nhwc(t: Tensor) -> Tensor:
    return t.contiguous(memory_format=NHWC)


def _channel_view(t: Tensor) -> Tensor:
    return t.contiguous().view(1, -1, 1, 1)


def _image(x: Tensor, scale: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    return _nhwc(_prologue(x, scale, bias))


def conv_stats_forward(x: Tensor, weight: Tensor, scale: Optional[Tensor], bias: Optional[Tensor],
                       padding: int) -> tuple[Tensor, Tensor, Tensor]:
    """reference_conv_stats's results through cuDNN graphs; y channels_last (as torch's own
    convolution makes it from channels_last inputs), the statistics fp32."""
    if not fusable(x, weight, scale, bias):
        return reference_conv_stats(x, weight, scale, bias, padding)
    prologue = scale is not None and bias is not None
    x, weight = _nhwc(x), _nhwc(weight)
    n, _, h, w = x.shape
    k, _, r, s = weight.shape
    y = torch.empty(n, k, h + 2 * padding - r + 1, w + 2 * padding - s + 1, dtype=x.dtype, device=x.device,
                    memory_format=NHWC)
    total = torch.zeros(k, dtype=torch.float32, device=x.device)  # zeroed as test_conv_genstats.py does
    sq_total = torch.zeros(k, dtype=torch.float32, device=x.device)
    bound = {"x": x, "w": weight, "y": y, "sum": total.view(1, k, 1, 1), "sq_sum": sq_total.view(1, k, 1, 1)}
    if prologue:
        bound.update(scale=_channel_view(scale), bias=_channel_view(bias))
    recipes = _recipes("fprop", prologue, x.dtype)
    entry = _graph(graph_key("fprop", _key_tensors(bound), padding), recipes, x.device)
    if isinstance(entry, Declined):
        return reference_conv_stats(x, weight, scale, bias, padding)
    if "image" in entry.tensors:
        bound["image"] = _image(x, scale, bias)
    _execute(entry, bound, x.device)
    if "stats" not in entry.recipe.fuses:
        wide = y.to(torch.float32)
        total, sq_total = wide.sum(CHANNELS), wide.square().sum(CHANNELS)
    return y, total, sq_total


def conv_stats_backward(grad_y: Tensor, grad_sum: Tensor, grad_sq_sum: Tensor, x: Tensor, weight: Tensor,
                        scale: Optional[Tensor], bias: Optional[Tensor], y: Tensor, padding: int
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """reference_conv_stats_backward's results: the incoming gradient in torch, then the dgrad and
    wgrad graphs, then the prologue's per-channel gradients in torch (see the module docstring)."""
    if not fusable(x, weight, scale, bias):
        return reference_conv_stats_backward(grad_y, grad_sum, grad_sq_sum, x, weight, scale, bias, y, padding)
    prologue = scale is not None and bias is not None
    channel, wide = (1, -1, 1, 1), torch.float32
    grad = _nhwc((grad_y.to(wide) + grad_sum.view(channel) + 2 * y.to(wide) * grad_sq_sum.view(channel)
                  ).to(y.dtype))
    x, weight = _nhwc(x), _nhwc(weight)
    dx = torch.empty_like(x, memory_format=NHWC)
    dw = torch.empty_like(weight, memory_format=NHWC)
    bound = {"x": x, "w": weight, "dy": grad, "dx": dx, "dw": dw}
    if prologue:
        bound.update(scale=_channel_view(scale), bias=_channel_view(bias))
    image: Optional[Tensor] = None

    def run(kind: str) -> Optional[Built]:
        nonlocal image
        recipes = _recipes(kind, prologue, x.dtype)
        roles = ("x", "w", "dy", "scale", "bias", "dx" if kind == "dgrad" else "dw")
        entry = _graph(graph_key(kind, _key_tensors({r: bound[r] for r in roles if r in bound}), padding),
                       recipes, x.device)
        if isinstance(entry, Declined):
            return None
        if "image" in entry.tensors:
            image = image if image is not None else _image(x, scale, bias)
            bound["image"] = image
        _execute(entry, bound, x.device)
        return entry

    dgrad = run("dgrad")
    if dgrad is None:  # the reference's data gradient, from the same combined gradient
        dx = torch.ops.aten.convolution_backward(
            grad, _image(x, scale, bias), weight, None, [1, 1], [padding] * 2, [1, 1], False, [0, 0], 1,
            [True, False, False])[0]
    if run("wgrad") is None:
        dw = torch.ops.aten.convolution_backward(
            grad, _image(x, scale, bias), weight, None, [1, 1], [padding] * 2, [1, 1], False, [0, 0], 1,
            [False, True, False])[1]
    if not prologue:
        return dx, dw, x.new_empty(0), x.new_empty(0)
    grad_pre = torch.where(_image(x, scale, bias) > 0, dx, torch.zeros_like(dx))
    grad_scale = (grad_pre.to(wide) * x.to(wide)).sum(CHANNELS).to(scale.dtype)
    grad_bias = grad_pre.to(wide).sum(CHANNELS).to(bias.dtype)
    return grad_pre * scale.view(channel), dw, grad_scale, grad_bias
