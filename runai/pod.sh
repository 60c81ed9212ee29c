#!/usr/bin/env bash
# What runs in each RunAI / Kubeflow PyTorchJob pod: ddp-launch in kubeflow mode, which
# reads PET_NNODES, RUNAI_NUM_OF_GPUS, the pod's RANK and MASTER_ADDR/PORT, waits for the
# master's DNS name, applies the site's RoCE settings (device and IPv4 RoCE v2 GID index
# found in sysfs) and execs torchrun. Per-rank logs: $DDP_RUN_DIR/logs (torchrun).
# DDP_RUN_DIR is required: runai/submit.sh gives each submission a run dir of its own. A pod
# cannot tell a new submission from a restart of its own (the job name, and so the pod's
# name, is the same), so a default would continue whatever run an earlier job left there.
# Usage (as the pod command): pod.sh [trainer flags...]
set -euo pipefail

pod::log() {
    printf 'pod: %s\n' "$*" >&2
}

# NCCL's shared-memory transport between the GPUs of one pod needs more than the 64 MiB
# /dev/shm a container runtime gives by default (NCCL troubleshooting, "Shared memory":
# "--shm-size=1g"; kubernetes#28272), and fails mid-run with "unhandled system error".
readonly POD_MIN_SHM_KIB=$((1024 * 1024))

pod::check_shm() {
    local -r gpus="${RUNAI_NUM_OF_GPUS:-1}"
    [[ "${gpus}" =~ ^[0-9]+$ ]] && [ "${gpus}" -gt 1 ] || return 0
    local size_kib
    size_kib="$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $2 }')" || true
    [[ "${size_kib}" =~ ^[0-9]+$ ]] || { pod::log "warning: cannot read the size of /dev/shm"; return 0; }
    if [ "${size_kib}" -lt "${POD_MIN_SHM_KIB}" ]; then
        pod::log "error: /dev/shm is $((size_kib / 1024)) MiB, and NCCL between the ${gpus} GPUs of this pod needs at least 1 GiB: submit with runai's --large-shm (runai/submit.sh adds it unless RUNAI_LARGE_SHM=0)"
        exit 2
    fi
}

main() {
    local -r data_dir="${DDP_DATA_DIR:-/mnt/data}"
    local -r run_dir="${DDP_RUN_DIR:-}"
    if [ -z "${run_dir}" ]; then
        pod::log "error: DDP_RUN_DIR is unset: submit with runai/submit.sh (a run dir per submission), or set it in the pod spec to a new directory per run (an earlier run's to continue it)"
        exit 2
    fi
    pod::log "pod ${HOSTNAME:-?}: rank ${RANK:-?} of ${PET_NNODES:-?} pods, ${RUNAI_NUM_OF_GPUS:-?} GPUs each," \
        "rendezvous ${MASTER_ADDR:-?}:${MASTER_PORT:-?}"
    pod::check_shm
    # The trainer's own list of files decides (ddp_contract.DATASET_FILES, on the image's PYTHONPATH).
    local missing
    missing="$(python3 -m ddp_contract dataset "${data_dir}")" \
        || { pod::log "error: ${missing:-the dataset check failed (see above)}: stage it on the PVC (make data DATA_DIR=...) or set DDP_DATA_DIR"; exit 2; }
    mkdir -p "${run_dir}/logs"
    exec ddp-launch --mode kubeflow --site "${DDP_SITE:-rcp}" --log-dir "${run_dir}/logs" \
        -- --data-dir "${data_dir}" --run-dir "${run_dir}" "$@"
}

main "$@"
