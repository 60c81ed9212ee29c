#!/usr/bin/env bash
# One prepared pass over a GPU node, for a short lease or the first job on a new GPU type:
# the GPU tests, every gpu_throughput.py variant, the trainer with and without the levers that won,
# and max-autotune's persistent cache on a second (requeued) start. Each step has a time cap, so a
# step that overruns costs its own figures only; logs and JSON land in $OUT (default ./gpu-check).
#
#   GPU_CHECK_BUDGET_S=570 benchmarks/gpu_node_check.sh   # all it has time for, what matters most first
#   GPU_CHECK_BUDGET_S=540 benchmarks/gpu_node_check.sh bn-fp16   # fp16 against bf16, our Triton BatchNorm
#
# It runs on the node's own python3 (no venv, no network): the checkout on PYTHONPATH, and wheels in
# .whl/ (a package the node lacks, such as nvidia-cudnn-frontend) installed into a scratch directory.
set -u
phase="${1:-all}"
case "${phase}" in all | bn-fp16) ;; *) echo "usage: $0 [all|bn-fp16]" >&2; exit 2 ;; esac
budget_s="${GPU_CHECK_BUDGET_S:-420}"
out="${OUT:-$PWD/gpu-check}"
mkdir -p "${out}"
started=${SECONDS}
here="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="${here}/src:${here}/entrypoints${PYTHONPATH:+:${PYTHONPATH}}" PYTHONUNBUFFERED=1
if compgen -G "${here}/.whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-check-site \
        "${here}"/.whl/*.whl && export PYTHONPATH="${PYTHONPATH}:/tmp/gpu-check-site"
fi

# The seconds a step may take: its own cap, or what is left of the budget, whichever is less.
cap() { local left=$((budget_s - (SECONDS - started))); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }
step() {  # step NAME CAP_S COMMAND...: run it capped, its output to $out/NAME.log, say how it ended
    local name="$1" limit; limit="$(cap "$2")"; shift 2
    echo "=== ${name} (cap ${limit} s, $((SECONDS - started)) s in)"
    timeout --kill-after=10 "${limit}" "$@" >"${out}/${name}.log" 2>&1
    local rc=$?
    tail -n 25 "${out}/${name}.log"
    echo "=== ${name}: exit ${rc}$([ "${rc}" = 124 ] && echo ' (cut at its cap)') after $((SECONDS - started)) s"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'
  python3 -c 'import cudnn; print("cudnn-frontend", cudnn.__version__, "backend", cudnn.backend_version())' 2>&1 | tail -n 1
} | tee "${out}/node.txt"

data="/tmp/gpu-check-cifar"
trainer() {  # trainer NAME FLAGS...: the default GPU path through ddp-launch, 3 epochs of 50,000 images
    local name="$1"
    shift
    step "trainer-${name}" 80 python3 -m ddp_launch --mode local -- --data-dir "${data}" \
        --run-dir "/tmp/gpu-check-run-${name}" --epochs 3 --allow-unverified-data --no-resume "$@"
    grep -E "Warm-up|Epoch [0-9]+/|Throughput|CUDA graph|Setup" "${out}/trainer-${name}.log" | tail -n 8
}

# In the order of what matters most: a step cut by the budget loses its own figures only.
python3 -m ddp_train.synthetic "${data}" --train 50000 --test 10000 --seed 0 >"${out}/data.log" 2>&1 &
data_pid=$!
if [ "${phase}" = bn-fp16 ]; then
    # fp16 (loss-scaled on the device) against bf16, and our Triton BatchNorm against inductor's: the
    # GPU tests, each kernel against a copy, the whole step alternating in one process, then the trainer.
    step gpu-tests 120 python3 -m pytest -q -p no:cacheprovider -rs -k on_the_gpu \
        tests/unit/train/test_loss_scale.py tests/unit/train/test_triton_bn.py
    step bn-bandwidth 120 python3 benchmarks/bn_bandwidth.py --json "${out}/bn-bandwidth.json"
    step fp16-triton 240 python3 benchmarks/gpu_throughput.py --variants graphs,triton-bn --precisions bf16,fp16 \
        --steps 30 --baseline-images 0 --json "${out}/fp16-triton.json"
    wait "${data_pid}"
    trainer bf16 --precision bf16
    trainer fp16 --precision fp16
    trainer bf16-seed1 --precision bf16 --seed 1  # how far two bf16 runs differ: the yardstick for fp16's
    trainer triton-bn --bn-kernels triton
    echo "=== done in $((SECONDS - started)) s; logs in ${out}"
    exit 0
fi
gpu_tests=(tests/unit/train/test_fused_blocks.py tests/unit/train/test_cuda_graph_report.py)
[ -f tests/unit/train/test_cudnn_blocks.py ] && gpu_tests+=(tests/unit/train/test_cudnn_blocks.py)
step gpu-tests 100 python3 -m pytest -q -p no:cacheprovider -rs -n 4 "${gpu_tests[@]}"
variants="eager,graphs,coop-reductions,no-split-reductions,conv1x1-mm,pdl,combo-kernels,fused-blocks"
python3 benchmarks/gpu_throughput.py --list 2>/dev/null | grep -q "fused-cudnn" && variants="${variants},fused-cudnn"
step variants 270 python3 benchmarks/gpu_throughput.py --variants "${variants}" --steps 30 --json "${out}/variants.json"
# The levers that beat plain graphs by 1% or more, together, against the default.
winners="$(python3 - "${out}/variants.json" <<'EOF'
import json, sys
from ddp_train import levers
try:
    rows = {r["variant"]: r["images_per_s"] for r in json.load(open(sys.argv[1]))}
except (OSError, ValueError):
    rows = {}
graphs = rows.get("graphs")
won = [name for name in levers.LEVERS if graphs and (rows.get(name) or 0) >= 1.01 * graphs]
print(",".join(won) or "none")
EOF
)"
echo "levers that won: ${winners}" | tee "${out}/winners.txt"
wait "${data_pid}"
trainer default --inductor-levers auto
[ "${winners}" != none ] && trainer levers --inductor-levers "${winners}"
cache=/tmp/gpu-check-cache
step autotune-cold 120 python3 benchmarks/gpu_throughput.py --variants max-autotune --steps 30 \
    --baseline-images 0 --compile-cache-dir "${cache}" --json "${out}/autotune-cold.json"
step autotune-requeue 50 python3 benchmarks/gpu_throughput.py --variants max-autotune --steps 30 \
    --baseline-images 0 --compile-cache-dir "${cache}" --json "${out}/autotune-requeue.json"
[ -f benchmarks/cudnn_fusion_probe.py ] && step cudnn-probe 45 python3 benchmarks/cudnn_fusion_probe.py \
    --budget-s 35 --json "${out}/cudnn-probe.json"
step unit-train 120 python3 -m pytest -q -p no:cacheprovider -n 14 tests/unit/train
echo "=== done in $((SECONDS - started)) s; logs in ${out}"
