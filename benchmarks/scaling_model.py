"""The 4 -> 8 GPU (1 -> 2 node) efficiency model of docs/benchmarks.md, printed as its table.

    python benchmarks/scaling_model.py

Ring all-reduce time T_ar = 2(n-1)/n * S / B (S gradient bytes, B the node's network bandwidth),
started bucket by bucket during backward (benchmarks/ddp_buckets.py: the first bucket is ready
after the last residual block, about 1/6 of backward; backward is about 2/3 of a step), so
exposed = max(T_ar - W, T_tail) with W = 5/6 * 2/3 * T_step, and T_tail the last bucket's
all-reduce, which cannot start before backward ends. Efficiency = T_step / (T_step + exposed),
taking the 4 GPUs inside one node (NVLink) as fully hidden.
"""

PARAMETERS = 17_174_324  # WideResNet, width 1.0 (sum of numel)
TAIL_BUCKET_BYTES = 12.30e6  # fp32, measured by benchmarks/ddp_buckets.py at bucket_cap_mb 25
FABRICS = {  # bytes/s per node
    "Slingshot-11, 4 x 200 Gb/s per GH200 node": 4 * 200e9 / 8,
    "InfiniBand HDR, 1 x 200 Gb/s per node": 200e9 / 8,
    "100 GbE": 100e9 / 8,
    "25 GbE": 25e9 / 8,
}
STEPS = {  # per-GPU step time in s: batch / images per s
    "guide, GH200, b256 fp16 (9.2k img/s)": 256 / 9200,
    "H100, b256 eager (17.4k img/s)": 256 / 17400,
    "H100, b1024 at the 27k img/s target": 1024 / 27000,
}


def efficiency(step_s: float, grad_bytes: float, bandwidth: float, n: int = 8) -> tuple[float, float]:
    ring = 2 * (n - 1) / n
    all_reduce = ring * grad_bytes / bandwidth
    tail = ring * TAIL_BUCKET_BYTES * grad_bytes / (4 * PARAMETERS) / bandwidth
    window = 5 / 6 * 2 / 3 * step_s
    exposed = max(all_reduce - window, tail)
    return all_reduce, step_s / (step_s + exposed)


def main() -> None:
    for label, per_param in (("fp32 gradients", 4), ("bf16 hook", 2)):
        grad = per_param * PARAMETERS
        print(f"\n{label}: {grad / 1e6:.2f} MB per step")
        print("| fabric | all-reduce (ms) | " + " | ".join(STEPS) + " |")
        print("|---|---|" + "---|" * len(STEPS))
        for fabric, bandwidth in FABRICS.items():
            cells = [efficiency(step, grad, bandwidth) for step in STEPS.values()]
            print(f"| {fabric} | {cells[0][0] * 1e3:.1f} | "
                  + " | ".join(f"{e * 100:.0f}%" for _, e in cells) + " |")


if __name__ == "__main__":
    main()
