"""torch.optim.SGD, the same code, without torch.compile's guards on its methods.

torch wraps Optimizer's add_param_group, state_dict, load_state_dict and zero_grad in
`torch._disable_dynamo` and SGD's step in `_use_grad_for_differentiable` (torch/optim/optimizer.py,
read in torch 2.14.1). Both wrappers import torch._dynamo the first time they run, to tell a
compiler that may be tracing to skip the method or to break its graph there. That import costs
about as much CPU again as `import torch`, in every rank, at the optimizer's construction: 1.0 of the
2.4 CPU-seconds a rank took to its first step on a 2-core x86_64 machine (benchmarks/rank_setup.py,
docs/benchmarks.md). The trainer never traces its optimizer (only the model is compiled:
fast/speed.py), so the wrappers cost it only that import.

EagerSGD calls the functions those wrappers wrap (inspect.unwrap follows functools.wraps'
`__wrapped__`), under the grad mode `_use_grad_for_differentiable` sets. Its state_dict is
torch.optim.SGD's, so checkpoints of either load into the other. Where a torch lays its wrappers out
otherwise, unwrap returns the method as it is: the same optimizer, with the import.
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch

_SGD_STEP = inspect.unwrap(torch.optim.SGD.step)


class EagerSGD(torch.optim.SGD):
    """torch.optim.SGD for a step no compiler traces (the module's docstring says why)."""

    add_param_group = inspect.unwrap(torch.optim.Optimizer.add_param_group)
    state_dict = inspect.unwrap(torch.optim.Optimizer.state_dict)
    load_state_dict = inspect.unwrap(torch.optim.Optimizer.load_state_dict)
    zero_grad = inspect.unwrap(torch.optim.Optimizer.zero_grad)

    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        # What _use_grad_for_differentiable does around SGD's step when nothing traces it.
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _SGD_STEP(self, closure)
