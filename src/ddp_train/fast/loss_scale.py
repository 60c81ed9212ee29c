"""fp16's dynamic loss scaling with its whole state on the device: the scaled loss, the inf check,
the skipped or taken step and the scale's growth or backoff are device ops on three fixed tensors,
so no step waits for the GPU and the whole sequence can be captured in a CUDA graph.

torch.amp.GradScaler is the reference and this is its fused-optimizer path, op for op
(torch/amp/grad_scaler.py, read in torch 2.14.1): `scale` multiplies the loss by the scale; `step`
checks every gradient with `torch._amp_foreach_non_finite_check_and_unscale_` at an inverse scale
of 1 (GradScaler's `_check_inf_per_device`) and hands `grad_scale` and `found_inf` to the fused
SGD (`optimizer.grad_scale`, `optimizer.found_inf`: torch/optim/sgd.py passes them to
`torch._fused_sgd_`, whose kernel divides each gradient by the scale and returns early when
found_inf is 1); `update` is `torch._amp_update_scale_` (backoff on an inf, growth after
growth_interval clean steps). The state dict has GradScaler's keys, so checkpoints carry over.

Why not GradScaler itself: every step it allocates new tensors (the inf flag, a dummy inverse
scale, their sum, the scale product), so its tensors have no fixed address, and it keeps a stage
per optimizer in Python. And torch's fused SGD creates its momentum buffers with `torch.empty_like`
on the first step and fills them in the kernel (`_fused_sgd` in torch/optim/sgd.py): a first step
skipped for an inf (common at fp16's initial scale of 2^16) leaves them uninitialised, and the next
step reads that memory (seen in https://github.com/LibreYOLO/libreyolo/pull/771). This scaler makes
zero buffers before the first step instead: with dampening 0, `momentum * 0 + grad` is the first
step's buffer, and a skipped step leaves zeros, as the unfused optimizer leaves no state at all.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

# GradScaler's defaults (torch/amp/grad_scaler.py).
INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


class LossScaler:
    """GradScaler's interface (scale, step, update, state_dict, load_state_dict, is_enabled) for a
    fused optimizer. Disabled (bf16, fp32), every method is a pass-through, as GradScaler's."""

    def __init__(self, device: torch.device, enabled: bool, init_scale: float = INIT_SCALE,
                 growth_factor: float = GROWTH_FACTOR, backoff_factor: float = BACKOFF_FACTOR,
                 growth_interval: int = GROWTH_INTERVAL):
        if growth_factor <= 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError(f"growth factor {growth_factor} must be over 1, backoff factor {backoff_factor} "
                             f"in (0, 1), growth interval {growth_interval} at least 1")
        self.enabled = enabled
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        # Allocated once and changed in place: a captured step keeps pointing at them.
        self.scale_factor = torch.full((), init_scale, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        self._unit = torch.ones((), dtype=torch.float32, device=device)  # the check's inverse scale

    def is_enabled(self) -> bool:
        return self.enabled

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_factor if self.enabled else loss

    def step(self, optimizer: torch.optim.Optimizer) -> Any:
        """The optimizer's step on the unscaled gradients, or nothing where a gradient is inf or NaN;
        both decided on the device, by the fused kernel."""
        if not self.enabled:
            return optimizer.step()
        if not getattr(optimizer, "_step_supports_amp_scaling", False):
            raise ValueError(f"{type(optimizer).__name__} is not fused: fp16 loss scaling skips a step on the "
                             f"device only through a fused optimizer (torch.optim.SGD(..., fused=True))")
        self.found_inf.zero_()
        for grads in gradients_by_dtype(optimizer).values():
            torch._amp_foreach_non_finite_check_and_unscale_(grads, self.found_inf, self._unit)
        make_momentum_buffers(optimizer)
        optimizer.grad_scale = self.scale_factor  # type: ignore[attr-defined]
        optimizer.found_inf = self.found_inf  # type: ignore[attr-defined]
        try:
            return optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]

    def update(self) -> None:
        """Halve the scale after a skipped step; double it after growth_interval clean steps in a row."""
        if self.enabled:
            torch._amp_update_scale_(self.scale_factor, self.growth_tracker, self.found_inf,
                                     self.growth_factor, self.backoff_factor, self.growth_interval)

    def state_dict(self) -> dict[str, Any]:
        """GradScaler's keys and values (reading them waits for the device: at checkpoints only)."""
        if not self.enabled:
            return {}
        return {"scale": self.scale_factor.item(), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": int(self.growth_tracker.item())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        if not state:
            raise RuntimeError("the saved scaler state is empty: it was saved by a run without fp16 loss scaling")
        self.scale_factor.fill_(float(state["scale"]))
        self.growth_tracker.fill_(int(state["_growth_tracker"]))
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])


def gradients_by_dtype(optimizer: torch.optim.Optimizer) -> dict[tuple[torch.device, torch.dtype], list[torch.Tensor]]:
    """The gradients in groups of one device and dtype, as the check op takes them (GradScaler's
    `_unscale_grads_` splits them the same way)."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                groups.setdefault((param.grad.device, param.grad.dtype), []).append(param.grad)
    return groups


def make_momentum_buffers(optimizer: torch.optim.Optimizer) -> None:
    """Zero momentum buffers where SGD has none yet, laid out as torch's own (empty_like(grad))."""
    for group in optimizer.param_groups:
        if group.get("momentum", 0) == 0:
            continue
        if group.get("dampening", 0) != 0:
            raise ValueError(f"SGD dampening {group['dampening']}: a zero first momentum buffer equals torch's "
                             f"first step only without dampening")
        for param in group["params"]:
            if param.grad is not None and optimizer.state[param].get("momentum_buffer") is None:
                optimizer.state[param]["momentum_buffer"] = torch.zeros_like(param.grad)
