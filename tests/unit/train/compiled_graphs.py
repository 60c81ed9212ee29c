"""The FX graphs torch.compile hands its compilers for a module's forward and backward, to count the
custom ops a model's compiled step calls (test_fused_blocks.py, bn_interpreter_cases.py)."""

from __future__ import annotations

from functools import partial

import torch
from functorch.compile import make_boxed_func
from torch._functorch.aot_autograd import aot_module_simplified


def compiled_step_graphs(module: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.fx.GraphModule]:
    """{"forward": graph, "backward": graph} of `module` compiled with fullgraph=True (a graph break
    fails), after one step of `module(x).square().mean()` backward, which leaves its gradients."""
    graphs: dict[str, torch.fx.GraphModule] = {}

    def capture(name, gm, _inputs):
        graphs[name] = gm
        return make_boxed_func(gm.forward)

    def backend(gm, inputs):
        return aot_module_simplified(gm, inputs, fw_compiler=partial(capture, "forward"),
                                     bw_compiler=partial(capture, "backward"))
    torch.compile(module, backend=backend, fullgraph=True)(x).square().mean().backward()
    return graphs


def op_count(graph: torch.fx.GraphModule, op) -> int:
    return sum(1 for node in graph.graph.nodes if node.target is op)
