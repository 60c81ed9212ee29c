#!/usr/bin/env bash
# Submit a multi-node DDP job to RunAI (EPFL RCP style): PET_NNODES pods x RUNAI_GPUS GPUs,
# RoCE through the kube-system/roce network and one rdma/rdma device per pod.
# Needs the RunAI CLI v1 with submit-dist (2.13 or newer; this form is the one RCP
# documents for runai 2.18.94). The newer "runai pytorch submit" (CLI v2) takes the
# same values under other flag names.
# Usage: runai/submit.sh [trainer flags...]     e.g. RUNAI_WORKERS=3 runai/submit.sh --epochs 50
# Settings (environment): RUNAI_JOB_NAME, RUNAI_IMAGE, RUNAI_WORKERS (pods besides the
# master), RUNAI_GPUS (per pod), RUNAI_RDMA (1: RoCE annotation and rdma resource),
# RUNAI_POD_SCRIPT (runai/pod.sh as the pod sees it: the image or a mounted checkout),
# RUNAI_EXTRA_ARGS (more runai flags, e.g. "--pvc name:/mnt/data", split on spaces),
# RUNAI_LARGE_SHM (1, the default: a large /dev/shm; 0: Kubernetes' 64 MiB default).
set -euo pipefail

runai_submit::err() {
    printf 'runai/submit.sh: error: %s\n' "$*" >&2
    exit 1
}

main() {
    local -r name="${RUNAI_JOB_NAME:-ddp-train}"
    local -r image="${RUNAI_IMAGE:-}"
    local -r workers="${RUNAI_WORKERS:-1}"
    local -r gpus="${RUNAI_GPUS:-4}"
    local -r pod_script="${RUNAI_POD_SCRIPT:-/opt/ddp/runai/pod.sh}"
    [ -n "${image}" ] || runai_submit::err "RUNAI_IMAGE is unset: push the image built by 'make dockerfile' and set RUNAI_IMAGE=registry/name:tag"
    [[ "${workers}" =~ ^[0-9]+$ ]] || runai_submit::err "RUNAI_WORKERS=${workers} is not a number of worker pods"
    [[ "${gpus}" =~ ^[0-9]+$ ]] || runai_submit::err "RUNAI_GPUS=${gpus} is not a number of GPUs per pod"
    command -v runai >/dev/null || runai_submit::err "runai CLI not found: install it from your RunAI cluster's web UI (version 2.13 or newer)"

    # --command: without it RunAI appends what follows `--` to the image's ENTRYPOINT
    # (ddp-launch), so every pod would run `ddp-launch /opt/ddp/runai/pod.sh ...` and exit 2;
    # with it, what follows `--` replaces the ENTRYPOINT (Run:ai CLI reference, runai
    # submit-dist pytorch: "--command: if set, overrides the image's entrypoint with the
    # command supplied after '--'"; the Kubernetes rule for a container's command/args).
    local -a args=(submit-dist pytorch --name "${name}" --workers="${workers}" -g "${gpus}" -i "${image}" --command)
    # Kubernetes gives a pod a 64 MiB /dev/shm; NCCL's shared-memory transport between the
    # GPUs of one pod needs far more and fails with "unhandled system error" (NCCL
    # troubleshooting, "Docker/shared memory"). --large-shm mounts a memory-backed /dev/shm.
    if [ "${RUNAI_LARGE_SHM:-1}" = 1 ]; then
        args+=(--large-shm)
    fi
    if [ "${RUNAI_RDMA:-1}" = 1 ]; then
        args+=(--annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1)
    fi
    local -a extra=()
    local -
    set -f
    # shellcheck disable=SC2206  # RUNAI_EXTRA_ARGS is a list of flags, split on spaces
    extra=(${RUNAI_EXTRA_ARGS:-})
    set +f
    exec runai "${args[@]}" "${extra[@]}" -- "${pod_script}" "$@"
}

main "$@"
