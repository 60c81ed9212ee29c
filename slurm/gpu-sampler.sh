#!/usr/bin/env bash
# Per-node GPU sampler: one CSV per node, OUT_DIR/gpu-<node>.csv, every INTERVAL seconds.
# Started by slurm/lib/ddp.sh as an overlapping step, stopped by SIGTERM to its PID;
# it stops its own nvidia-smi by PID (never pkill: other users' samplers share the node).
# Usage: gpu-sampler.sh OUT_DIR INTERVAL
set -euo pipefail

readonly QUERY="timestamp,index,name,utilization.gpu,utilization.memory,memory.total,memory.used"

sampler::log() {
    printf 'gpu-sampler: %s\n' "$*" >&2
}

main() {
    local -r out_dir="${1:?usage: gpu-sampler.sh OUT_DIR INTERVAL}"
    local -r interval="${2:?usage: gpu-sampler.sh OUT_DIR INTERVAL}"
    local -r node="${SLURMD_NODENAME:-$(hostname -s)}"
    if ! command -v nvidia-smi >/dev/null; then
        sampler::log "nvidia-smi not found on ${node}: no GPU to sample, not monitoring"
        return 0
    fi
    local -r csv="${out_dir}/gpu-${node}.csv"
    nvidia-smi --query-gpu="${QUERY}" --format=csv,nounits -l "${interval}" > "${csv}" &
    local -r smi_pid=$!
    trap 'kill -TERM "${smi_pid}" 2>/dev/null || true' TERM INT
    sampler::log "sampling every ${interval}s on ${node} into ${csv} (nvidia-smi pid ${smi_pid})"
    wait "${smi_pid}" || true
}

main "$@"
