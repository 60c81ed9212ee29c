"""The GPU speed code: what makes a step fast on a GPU and says whether it is, and nothing a run's
result depends on (a run trains the same numbers without it, within the precision's rounding).

- speed: torch.compile with a persistent cache, DDP's buckets and comm hook, the warm-up off the clock.
- levers: inductor options a compiled step may set (--inductor-levers) and BatchNorm's kernels (--bn-kernels).
- cudagraph_report: whether the compiled step runs as a CUDA graph on each rank, or inductor's reason.
- loss_scale: fp16's loss scaling on the device, without a host sync per step.
- bn_kernels, bn_blocks: BatchNorm (+ReLU, +add) as our own Triton kernels, and the residual block using them.
- fused_blocks, cudnn_blocks: residual blocks as custom ops, and the cuDNN-frontend kernels they may run on.

Nothing here is imported by this file: config.py reads fast.levers without torch.
"""
