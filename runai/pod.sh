#!/usr/bin/env bash
# What runs in each RunAI / Kubeflow PyTorchJob pod: the checks a SLURM job's script runs before
# training, then ddp-launch in kubeflow mode, which reads PET_NNODES, RUNAI_NUM_OF_GPUS (else
# PET_NPROC_PER_NODE: auto, cpu, gpu or a count), the pod's RANK and MASTER_ADDR/PORT, waits for
# the master's DNS name, applies the site's RoCE settings (device and IPv4 RoCE v2 GID index found
# in sysfs) and execs torchrun. Per-rank logs: $DDP_RUN_DIR/logs (torchrun).
#
# The checks, in order: the run dir can be written, /dev/shm, the dataset (here); then `ddp-launch
# preflight` (entrypoints/ddp_launch/preflight.py): the run dir is not another job's, `ddp-launch
# doctor` on every pod with one verdict for all (a check that fails on every pod is the setup's:
# one line, exit 2; a pod that fails alone is named, and every pod exits 76 so the operator's
# restart policy acts, a pod being unable to requeue itself without its node as a SLURM job does),
# the fabric gate across the pods (a pod it names: the same), and it execs the training.
#   DDP_PREFLIGHT=0     skips doctor; DDP_FABRIC_GATE=0 skips the fabric gate (as on SLURM)
#   NCCL_IB_DISABLE=1   no RoCE: IP sockets, with NCCL's socket threads and sockets per GPU set as for
#                       RoCE, and doctor expects no RDMA device (runai/submit.sh sets it for RUNAI_RDMA=0)
# DDP_RUN_DIR is required: runai/submit.sh gives each submission a run dir of its own. A pod
# cannot tell a new submission from a restart of its own (the job name, and so the pod's
# name, is the same), so a default would continue whatever run an earlier job left there.
# The workload is read once from the arguments (python3 -m ddp_contract.workload_choice): the built-in
# trainer's flags, or your own script or module named first, with exactly its arguments, which gets
# DDP_RUN_DIR and DDP_DATA_DIR (where that directory exists) as variables and needs no CIFAR-100
# (docs/own-script.md). The script must be where the pods see it: the image, or a claim they mount.
#   DDP_RESUME_RUN=RUN   continue the run RUN instead, beside DDP_RUN_DIR (its parent is the runs
#                       directory), with the trainer's --resume: how a Kubeflow job goes on with the
#                       run of a job that is gone (kubeflow/*.yaml name each job's run after the job)
# Usage (as the pod command): pod.sh [trainer flags...] | pod.sh --script PATH [its arguments...]
set -euo pipefail

pod::log() {
    printf 'pod: %s\n' "$*" >&2
}

pod::err() {
    pod::log "error: $*"
    exit 2
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
        pod::err "/dev/shm is $((size_kib / 1024)) MiB, and NCCL between the ${gpus} GPUs of this pod needs at least 1 GiB: submit with runai's --large-shm (runai/submit.sh adds it unless RUNAI_LARGE_SHM=0)"
    fi
}

# The run dir on the claim, written by this pod's user: the image's unless the submission names
# one (a pod's securityContext runAsUser; RunAI's --run-as-uid/--run-as-gid, which RCP's csub.py
# passes and runai/submit.sh takes from RUNAI_RUN_AS). A claim's directory made by the user's own
# uid with mode 0755 refuses every other.
pod::make_run_dir() {
    local -r run_dir="$1"
    local why
    why="$(mkdir -p -- "${run_dir}/logs" 2>&1)" && [ -w "${run_dir}" ] && return 0
    local existing="${run_dir}"
    while [ ! -e "${existing}" ] && [ "${existing}" != / ]; do
        existing="$(dirname -- "${existing}")"
    done
    local owner
    owner="$(stat -c 'uid %u gid %g, mode %a' -- "${existing}" 2>/dev/null)" || owner="owner unknown"
    pod::err "cannot write the run dir ${run_dir} (${why:-not writable}) as uid $(id -u) gid $(id -g): ${existing} is ${owner}; submit the pods as its owner (RUNAI_RUN_AS=UID:GID runai/submit.sh, on RCP your ids from id on haas001.rcp.epfl.ch; a pod spec of your own: securityContext runAsUser and runAsGroup) or make ${existing} writable for uid $(id -u)"
}

main() {
    local -r data_dir="${DDP_DATA_DIR:-/mnt/data}"
    local run_dir="${DDP_RUN_DIR:-}"
    local -r site="${DDP_SITE:-rcp}"
    if [ -z "${run_dir}" ]; then
        pod::err "DDP_RUN_DIR is unset: submit with runai/submit.sh (a run dir per submission), or set it in the pod spec to a new directory per run (an earlier run's to continue it)"
    fi
    # A run of an earlier job, continued: the trainer's --resume makes a mistyped name an error in
    # one line (no checkpoint there), not a new run. A workload of the user's gets the run dir and
    # DDP_RESUME=1, and is not given --resume.
    local -a resume=()
    if [ -n "${DDP_RESUME_RUN:-}" ]; then
        [[ "${DDP_RESUME_RUN}" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] \
            || pod::err "DDP_RESUME_RUN=${DDP_RESUME_RUN} is not a run's name: give the name of the job that started the run (its directory under $(dirname -- "${run_dir}"))"
        run_dir="$(dirname -- "${run_dir}")/${DDP_RESUME_RUN}"
        resume=(--resume)
        export DDP_RESUME=1  # what a workload of the user's reads (ddp_contract.workload.resuming)
        pod::log "continuing run ${DDP_RESUME_RUN} in ${run_dir} (DDP_RESUME_RUN)"
    fi
    pod::log "pod ${HOSTNAME:-?}: rank ${RANK:-?} of ${PET_NNODES:-?} pods, ${RUNAI_NUM_OF_GPUS:-?} GPUs each," \
        "rendezvous ${MASTER_ADDR:-?}:${MASTER_PORT:-?}"
    pod::make_run_dir "${run_dir}"
    pod::check_shm
    local -a choice=()
    mapfile -t -d '' choice < <(python3 -m ddp_contract.workload_choice --check-file pod 0 "$@")
    [ "${#choice[@]}" -ge 4 ] && [ -z "${choice[-1]}" ] || exit 2  # python3 said why on stderr
    unset 'choice[-1]'
    local -r kind="${choice[0]}" target="${choice[1]}"
    local -a args=("${choice[@]:3}")
    if [ "${kind}" != builtin ]; then
        # A workload of the user's: its arguments exactly, the dirs as variables, no CIFAR-100 to stage.
        local -a data=()
        if [ -d "${data_dir}" ]; then
            export DDP_DATA_DIR="${data_dir}"
            data=(--data-dir "${data_dir}")
        else
            unset DDP_DATA_DIR
        fi
        export DDP_RUN_DIR="${run_dir}"
        pod::log "workload: --${kind} ${target}, with ${#args[@]} argument(s) of its own"
        exec ddp-launch preflight --site "${site}" "${data[@]}" --run-dir "${run_dir}" \
            -- --mode kubeflow --site "${site}" --log-dir "${run_dir}/logs" "--${kind}" "${target}" \
            -- "${args[@]}"
    fi
    # The trainer's own list of files decides (ddp_contract.DATASET_FILES, on the image's PYTHONPATH).
    local missing
    # The staging command: runai/submit.sh's, whose one pod runs the download below with the claim at
    # the same mount point and as the same user as these pods.
    missing="$(python3 -m ddp_contract dataset "${data_dir}")" \
        || pod::err "${missing:-the dataset check failed (see above)}: stage it on the claim once, where you submit from, with the same RUNAI_* settings: runai/submit.sh --download (one pod runs python3 -m ddp_contract download ${data_dir}); a job of your own: that command in a pod of this image that mounts the claim; or set DDP_DATA_DIR to where it is"
    exec ddp-launch preflight --site "${site}" --data-dir "${data_dir}" --run-dir "${run_dir}" \
        -- --mode kubeflow --site "${site}" --log-dir "${run_dir}/logs" \
        -- --data-dir "${data_dir}" --run-dir "${run_dir}" "${resume[@]}" "${args[@]}"
}

main "$@"
