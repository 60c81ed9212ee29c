#!/usr/bin/env bash
# What runs in each RunAI / Kubeflow PyTorchJob pod: ddp-launch in kubeflow mode, which
# reads PET_NNODES, RUNAI_NUM_OF_GPUS, the pod's RANK and MASTER_ADDR/PORT, waits for the
# master's DNS name, applies the site's RoCE settings (device and IPv4 RoCE v2 GID index
# found in sysfs) and execs torchrun. Per-rank logs: $DDP_RUN_DIR/logs (torchrun).
# Usage (as the pod command): pod.sh [trainer flags...]
set -euo pipefail

pod::log() {
    printf 'pod: %s\n' "$*" >&2
}

main() {
    local -r data_dir="${DDP_DATA_DIR:-/mnt/data}"
    local -r run_dir="${DDP_RUN_DIR:-/mnt/runs/${HOSTNAME%-*-[0-9]*}}"
    pod::log "pod ${HOSTNAME:-?}: rank ${RANK:-?} of ${PET_NNODES:-?} pods, ${RUNAI_NUM_OF_GPUS:-?} GPUs each," \
        "rendezvous ${MASTER_ADDR:-?}:${MASTER_PORT:-?}"
    # The trainer's own list of files decides (ddp_contract.DATASET_FILES, on the image's PYTHONPATH).
    local missing
    missing="$(python3 -m ddp_contract dataset "${data_dir}")" \
        || { pod::log "error: ${missing:-the dataset check failed (see above)}: stage it on the PVC (make data DATA_DIR=...) or set DDP_DATA_DIR"; exit 1; }
    mkdir -p "${run_dir}/logs"
    exec ddp-launch --mode kubeflow --site "${DDP_SITE:-rcp}" --log-dir "${run_dir}/logs" \
        -- --data-dir "${data_dir}" --run-dir "${run_dir}" "$@"
}

main "$@"
