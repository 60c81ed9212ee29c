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
# RUNAI_DATA_PVC (required: the PVC that holds cifar-100-python/) mounted at RUNAI_DATA_DIR
# (default /mnt/data), RUNAI_RUN_PVC (required: the PVC for checkpoints, metrics and logs;
# it may be the same claim) mounted at RUNAI_RUN_DIR (default /mnt/runs; the same claim may
# share one mount point with the data), RUNAI_DATA_SUBDIR and RUNAI_RUN_SUBDIR (where in
# the claim the data and the runs are, relative to its root: homes/<user>/data on a shared
# claim such as RCP's /mloscratch; default its root), RUNAI_RESUME (the name of an earlier
# run to continue; default a new run, RUNAI_JOB_NAME-<UTC time>, in the runs directory),
# RUNAI_EXTRA_ARGS (more runai flags, words with the shell's quoting:
# RUNAI_EXTRA_ARGS="-e 'NOTE=two words'"; python3 splits them),
# RUNAI_LARGE_SHM (1, the default: a large /dev/shm; 0: Kubernetes' 64 MiB default).
set -euo pipefail

runai_submit::err() {
    printf 'runai/submit.sh: error: %s\n' "$*" >&2
    exit 2
}

# A volume setting: the name of an existing PVC and its mount point in every pod.
runai_submit::check_volume() {
    local -r setting="$1" claim="$2" dir_setting="$3" dir="$4" what="$5"
    [ -n "${claim}" ] || runai_submit::err "${setting} is unset: name the PVC that holds ${what} (kubectl get pvc lists yours), e.g. ${setting}=my-scratch"
    [[ "${claim}" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || runai_submit::err "${setting}=${claim} is not a PVC name (lower-case letters, digits, '-' and '.', as Kubernetes names objects)"
    [[ "${dir}" = /* && "${dir}" != *,* ]] || runai_submit::err "${dir_setting}=${dir} must be an absolute path without ',' (the mount point in the pod)"
}

# A directory inside a claim, relative to its root (Kubernetes' subPath is "Path within the volume
# from which the container's volume should be mounted", https://kubernetes.io/docs/concepts/storage/volumes/#using-subpath;
# here the claim is mounted whole and the path is taken below the mount point). Prints it without
# a trailing '/'.
runai_submit::subdir() {
    local -r setting="$1" value="${2%/}" example="$3"
    [ -n "${value}" ] || return 0
    if [[ "${value}" = /* || "${value}" = *,* || "/${value}/" = */../* || "/${value}/" = */./* || "${value}" = *//* ]]; then
        runai_submit::err "${setting}=${2} must be a path inside the claim, relative to its root, without '..', '.' or ',' (e.g. ${setting}=${example})"
    fi
    printf '%s\n' "${value}"
}

# A setting's words by the shell's quoting rules, with no expansion: the rule the SLURM job
# scripts split DDP_TRAIN_ARGS with (entrypoints/ddp_contract/shell_words.py, from this checkout).
# The words come back NUL-terminated, then one empty word that says the split succeeded.
#   runai_submit::split_words ARRAY_NAME VARIABLE_NAME
runai_submit::split_words() {
    local -n into="$1"
    local -r name="$2"
    into=()
    [ -n "${!name:-}" ] || return 0
    command -v python3 >/dev/null || runai_submit::err "python3 not found: it splits ${name} into words; install it or leave ${name} unset"
    local -r entrypoints="$(CDPATH="" cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../entrypoints" && pwd)"
    mapfile -t -d '' into < <(PYTHONPATH="${entrypoints}${PYTHONPATH:+:${PYTHONPATH}}" python3 -m ddp_contract.shell_words runai/submit.sh "${name}" "${!name}")
    [ "${#into[@]}" -gt 0 ] && [ -z "${into[-1]}" ] || exit 2  # python3 said why on stderr
    unset 'into[-1]'
}

main() {
    local -r name="${RUNAI_JOB_NAME:-ddp-train}"
    local -r image="${RUNAI_IMAGE:-}"
    local -r workers="${RUNAI_WORKERS:-1}"
    local -r gpus="${RUNAI_GPUS:-4}"
    local -r pod_script="${RUNAI_POD_SCRIPT:-/opt/ddp/runai/pod.sh}"
    local -r data_dir="${RUNAI_DATA_DIR:-/mnt/data}" run_dir="${RUNAI_RUN_DIR:-/mnt/runs}"
    [ -n "${image}" ] || runai_submit::err "RUNAI_IMAGE is unset: push the image built by 'make dockerfile' and set RUNAI_IMAGE=registry/name:tag"
    [[ "${workers}" =~ ^[0-9]+$ ]] || runai_submit::err "RUNAI_WORKERS=${workers} is not a number of worker pods"
    [[ "${gpus}" =~ ^[0-9]+$ ]] || runai_submit::err "RUNAI_GPUS=${gpus} is not a number of GPUs per pod"
    runai_submit::check_volume RUNAI_DATA_PVC "${RUNAI_DATA_PVC:-}" RUNAI_DATA_DIR "${data_dir}" \
        "cifar-100-python/ (stage it with make data DATA_DIR=... from a pod that mounts it)"
    runai_submit::check_volume RUNAI_RUN_PVC "${RUNAI_RUN_PVC:-}" RUNAI_RUN_DIR "${run_dir}" \
        "the runs: checkpoints, metrics, logs (it may be the data PVC)"
    # One claim may be mounted once for both; two claims cannot share a mount point (Kubernetes
    # refuses a pod whose volumeMounts repeat a mountPath: "must be unique").
    [ "${run_dir}" != "${data_dir}" ] || [ "${RUNAI_RUN_PVC}" = "${RUNAI_DATA_PVC}" ] \
        || runai_submit::err "RUNAI_RUN_DIR and RUNAI_DATA_DIR are both ${run_dir} for two claims (${RUNAI_DATA_PVC}, ${RUNAI_RUN_PVC}): give each claim its own mount point"
    local data_subdir run_subdir
    data_subdir="$(runai_submit::subdir RUNAI_DATA_SUBDIR "${RUNAI_DATA_SUBDIR:-}" "homes/${USER:-me}/data")"
    run_subdir="$(runai_submit::subdir RUNAI_RUN_SUBDIR "${RUNAI_RUN_SUBDIR:-}" "homes/${USER:-me}/runs")"
    # A new submission is a new run: a job name used before (RunAI frees it once the old job is
    # deleted) would otherwise find the old run's checkpoint and continue it, or report it done.
    # RUNAI_RESUME names the run to continue instead.
    local run="${RUNAI_RESUME:-}"
    if [ -n "${run}" ]; then
        [[ "${run}" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] \
            || runai_submit::err "RUNAI_RESUME=${run} is not a run's name: give the directory name under the runs directory that the submit of that run printed (e.g. RUNAI_RESUME=${name}-20260101-120000)"
    else
        run="${name}-$(date -u +%Y%m%d-%H%M%S)"
    fi
    local -r data_path="${data_dir}${data_subdir:+/${data_subdir}}"
    local -r run_path="${run_dir}${run_subdir:+/${run_subdir}}/${run}"
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
    else
        # No RoCE: NCCL's own switch to IP sockets, which ddp-launch and doctor read as "no RDMA device expected".
        args+=(-e NCCL_IB_DISABLE=1)
    fi
    # Existing PVCs: --existing-pvc claimname=NAME,path=PATH (Run:ai CLI reference, runai
    # submit-dist pytorch; --pvc instead creates a new claim from a storage class). pod.sh
    # reads DDP_DATA_DIR and DDP_RUN_DIR (-e NAME=VALUE: a variable in every pod).
    args+=(--existing-pvc "claimname=${RUNAI_DATA_PVC},path=${data_dir}")
    if [ "${run_dir}" != "${data_dir}" ]; then
        args+=(--existing-pvc "claimname=${RUNAI_RUN_PVC},path=${run_dir}")
    fi
    args+=(-e "DDP_DATA_DIR=${data_path}" -e "DDP_RUN_DIR=${run_path}")
    local -a extra=()
    runai_submit::split_words extra RUNAI_EXTRA_ARGS
    # The trainer's --resume: with it, a run dir without a checkpoint (a mistyped name) is an error
    # in one line rather than a new run (src/ddp_train/checkpoint.py).
    local -a resume=()
    if [ -n "${RUNAI_RESUME:-}" ]; then
        resume=(--resume)
        printf 'runai/submit.sh: continuing run %s in %s\n' "${run}" "${run_path}" >&2
    else
        printf 'runai/submit.sh: a new run, %s, in %s (RUNAI_RESUME=%s continues it)\n' "${run}" "${run_path}" "${run}" >&2
    fi
    exec runai "${args[@]}" "${extra[@]}" -- "${pod_script}" "${resume[@]}" "$@"
}

main "$@"
