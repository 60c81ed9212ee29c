#!/usr/bin/env bash
# Per-node GPU sampler: one CSV per node, OUT_DIR/gpu-<node>.csv, every INTERVAL seconds.
# Started by slurm/lib/ddp.sh as an overlapping step, stopped by SIGTERM to its PID;
# it stops its own sampling tool by PID (never pkill: other users' samplers share the node).
# The tool is the site's vendor's (DDP_SITE's accelerator: nvidia-smi, rocm-smi), asked of
# `python3 -m ddp_launch.accelerators`, as ddp.sh asks it for Apptainer's GPU flag.
# Usage: gpu-sampler.sh OUT_DIR INTERVAL
set -euo pipefail

SAMPLER_REPO="$(CDPATH="" cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)"
readonly SAMPLER_REPO

sampler::log() {
    printf 'gpu-sampler: %s\n' "$*" >&2
}

# The site's answer to QUESTION (python3 -m ddp_launch.accelerators --site DDP_SITE ...).
sampler::ask() {
    PYTHONPATH="${SAMPLER_REPO}/entrypoints${PYTHONPATH:+:${PYTHONPATH}}" \
        python3 -m ddp_launch.accelerators ${DDP_SITE:+--site "${DDP_SITE}"} "$@"
}

# Runs a tool that samples once (rocm-smi has no repeat flag) every INTERVAL seconds into one
# CSV: its header once, with a timestamp column first, then each sample's rows stamped.
sampler::every() {
    local -r interval="$1" csv="$2"
    shift 2
    local header="" stamp output line first sleeper=""
    trap 'kill -TERM "${sleeper}" 2>/dev/null || true; exit 0' TERM INT
    while true; do
        stamp="$(date '+%Y/%m/%d %H:%M:%S.%3N')"
        output="$("$@")" || sampler::log "$1 exited $? at ${stamp}"
        first=1
        while IFS= read -r line; do
            [ -n "${line}" ] || continue
            if [ "${first}" = 1 ]; then
                first=0
                if [ -z "${header}" ]; then
                    header="${line}"
                    printf 'timestamp,%s\n' "${header}" >> "${csv}"
                fi
                continue
            fi
            printf '%s,%s\n' "${stamp}" "${line}" >> "${csv}"
        done <<< "${output}"
        sleep "${interval}" &
        sleeper=$!
        wait "${sleeper}" || true
    done
}

main() {
    local -r out_dir="${1:?usage: gpu-sampler.sh OUT_DIR INTERVAL}"
    local -r interval="${2:?usage: gpu-sampler.sh OUT_DIR INTERVAL}"
    local -r node="${SLURMD_NODENAME:-$(hostname -s)}"
    local words repeats
    words="$(sampler::ask --interval "${interval}" sampler)" \
        || { sampler::log "cannot tell the site's sampler (see above): not monitoring"; return 1; }
    repeats="$(sampler::ask sampler-repeats)" \
        || { sampler::log "cannot tell the site's sampler (see above): not monitoring"; return 1; }
    local -a command
    mapfile -t command <<< "${words}"
    local -r tool="${command[0]}"
    if ! command -v "${tool}" >/dev/null; then
        sampler::log "${tool} not found on ${node}: no GPU to sample, not monitoring"
        return 0
    fi
    local -r csv="${out_dir}/gpu-${node}.csv"
    if [ "${repeats}" = 1 ]; then
        "${command[@]}" > "${csv}" &
    else
        sampler::every "${interval}" "${csv}" "${command[@]}" &
    fi
    local -r tool_pid=$!
    trap 'kill -TERM "${tool_pid}" 2>/dev/null || true' TERM INT
    sampler::log "sampling every ${interval}s on ${node} into ${csv} (${tool} pid ${tool_pid})"
    wait "${tool_pid}" || true
}

main "$@"
