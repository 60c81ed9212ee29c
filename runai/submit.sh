#!/usr/bin/env bash
# Submit a multi-node DDP job to RunAI (EPFL RCP style): PET_NNODES pods x RUNAI_GPUS GPUs,
# RoCE through the kube-system/roce network and one rdma/rdma device per pod.
# Speaks the RunAI CLI that is installed: v1, `runai submit-dist pytorch` (2.13 or newer; the form
# RCP documents for runai 2.18.94), or v2, `runai training pytorch submit NAME` (RunAI 2.18 or
# newer, and NVIDIA Run:ai's self-hosted v3); RUNAI_CLI=v1 or v2 says which instead.
# Usage: runai/submit.sh [trainer flags...]     e.g. RUNAI_WORKERS=3 runai/submit.sh --epochs 50
#        runai/submit.sh --script PATH [its arguments...]   your own script, at its path in the pods: on a
#        claim they mount (RUNAI_RUN_DIR's, RUNAI_DATA_DIR's) or in the image (docs/own-script.md)
#        runai/submit.sh --download            CIFAR-100 onto the data claim, once: one pod, no GPU,
#                                              `python3 -m ddp_contract download` into the data dir
# Each submission is a workload of its own, named RUNAI_JOB_NAME-<UTC time>-<4 random characters>
# (a Kubernetes name, unique until the workload is deleted); a new run is named as its workload.
# Settings (environment): RUNAI_JOB_NAME (the names' prefix, default ddp-train), RUNAI_IMAGE,
# RUNAI_WORKERS (pods besides the master), RUNAI_GPUS (per pod), RUNAI_RDMA (1: RoCE annotation
# and rdma resource), RUNAI_POD_SCRIPT (runai/pod.sh as the pod sees it: the image or a mounted
# checkout),
# RUNAI_DATA_PVC (required: the PVC that holds cifar-100-python/) mounted at RUNAI_DATA_DIR
# (default /mnt/data), RUNAI_RUN_PVC (required: the PVC for checkpoints, metrics and logs;
# it may be the same claim) mounted at RUNAI_RUN_DIR (default /mnt/runs; the same claim may
# share one mount point with the data), RUNAI_DATA_SUBDIR and RUNAI_RUN_SUBDIR (where in
# the claim the data and the runs are, relative to its root: homes/<user>/data on a shared
# claim such as RCP's /mloscratch; default its root), RUNAI_RESUME (the name of an earlier
# run to continue, in a new workload; default a new run, named as its workload, in the runs
# directory), RUNAI_RUN_PVC_MOUNT (where this machine mounts RUNAI_RUN_PVC, if it does: RCP's
# haas001.rcp.epfl.ch has the scratch claim at /mnt/mlo/scratch; a resume is then checked here, before
# any pod starts), RUNAI_EXTRA_ARGS (more runai flags, words with the shell's quoting:
# RUNAI_EXTRA_ARGS="-e 'NOTE=two words'"; python3 splits them),
# RUNAI_LARGE_SHM (1, the default: a large /dev/shm; 0: Kubernetes' 64 MiB default),
# RUNAI_RUN_AS (required: UID:GID the pods run as, your uid and gid on the cluster, as RCP's recipe
# runs them; `image` keeps the image's user).
set -euo pipefail

runai_submit::err() {
    printf 'runai/submit.sh: error: %s\n' "$*" >&2
    exit 2
}

# A workload's name is a Kubernetes object name, and a PyTorchJob's must be a DNS-1035 label
# (kubeflow/training-operator, pkg/webhooks/pytorch: NameIsDNS1035Label): lower-case letters,
# digits and '-', starting with a letter, ending with a letter or digit. The RunAI CLI takes at
# most 49 characters (run-ai/runai-cli, pkg/util/validate.go: JobMaxLength = 49); a pod's name
# and its Service's add -master-0 or -worker-N to it, within a DNS label's 63.
readonly RUNAI_SUBMIT_NAME_MAX=49
# The name's tail: -<UTC time, to the second>-<4 characters>. The time sorts and dates the runs, as
# RCP's csub.py names its jobs (epfml/getting-started, csub.py: %Y%m%d-%H%M%S); the 4 random
# characters keep two submissions in one second apart (a loop of them, or two shells), where
# Kubernetes would refuse the second name ("already exists") and both would share one run dir.
readonly RUNAI_SUBMIT_TAIL_LENGTH=$((1 + 15 + 1 + 4))
readonly RUNAI_SUBMIT_PREFIX_MAX=$((RUNAI_SUBMIT_NAME_MAX - RUNAI_SUBMIT_TAIL_LENGTH))

# A new workload name: PREFIX-<UTC time>-<4 random lower-case letters or digits>.
runai_submit::new_name() {
    local -r prefix="$1" alphabet=abcdefghijklmnopqrstuvwxyz0123456789
    local stamp random=""
    stamp="$(date -u +%Y%m%d-%H%M%S)"
    while [ "${#random}" -lt 4 ]; do
        random+="${alphabet:RANDOM % ${#alphabet}:1}"
    done
    printf '%s-%s-%s\n' "${prefix}" "${stamp}" "${random}"
}

# Which CLI is installed: the one that has its PyTorch submit command. Version numbers do not tell
# them apart (each follows the cluster's: 2.18 has both); their command trees do (the v1 reference
# documents `runai submit-dist pytorch`, the v2 reference `runai training pytorch submit`, and
# neither has the other's). Both are cobra programs, where `--help` on a command prints its help
# and exits 0 and an unknown command is "Error: unknown command", exit 1 (run-ai/runai-cli). v1
# first: it is RCP's documented form (epfml/getting-started, docs/multinode.md).
runai_submit::cli() {
    if runai submit-dist pytorch --help >/dev/null 2>&1; then
        echo v1
    elif runai training pytorch submit --help >/dev/null 2>&1; then
        echo v2
    else
        runai_submit::err "$(command -v runai) has neither 'runai submit-dist pytorch' (RunAI CLI v1) nor 'runai training pytorch submit' (CLI v2): install the CLI from your RunAI cluster's web UI, or set RUNAI_CLI=v1 or v2"
    fi
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

# python3 -m MODULE ARGS... with this checkout's entrypoints/ first on its path (standard library
# only, Python 3.6 or newer: entrypoints/host-modules.txt).
runai_submit::contract() {
    local -r entrypoints="$(CDPATH="" cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../entrypoints" && pwd)"
    PYTHONPATH="${entrypoints}${PYTHONPATH:+:${PYTHONPATH}}" python3 -m "$@"
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
    mapfile -t -d '' into < <(runai_submit::contract ddp_contract.shell_words runai/submit.sh "${name}" "${!name}")
    [ "${#into[@]}" -gt 0 ] && [ -z "${into[-1]}" ] || exit 2  # python3 said why on stderr
    unset 'into[-1]'
}

# The workload the pods run, read as pod.sh reads it (python3 -m ddp_contract.workload_choice, from this
# checkout): sets WORKLOAD_KIND (builtin, script or module) and WORKLOAD_TARGET. A script's path is the
# pods', not this machine's: it is not looked for here, but one that no mount point holds is named.
#   runai_submit::workload DATA_DIR RUN_DIR ARGS...
runai_submit::workload() {
    local -r data_dir="$1" run_dir="$2"
    shift 2
    WORKLOAD_KIND=builtin WORKLOAD_TARGET=""
    case "${1:-}" in --script | --script=* | --module | --module=*) ;; *) return 0 ;; esac
    local -r entrypoints="$(CDPATH="" cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../entrypoints" && pwd)"
    local -a choice=()
    mapfile -t -d '' choice < <(PYTHONPATH="${entrypoints}${PYTHONPATH:+:${PYTHONPATH}}" python3 -m ddp_contract.workload_choice runai/submit.sh 0 "$@")
    [ "${#choice[@]}" -ge 4 ] && [ -z "${choice[-1]}" ] || exit 2  # python3 said why on stderr
    WORKLOAD_KIND="${choice[0]}" WORKLOAD_TARGET="${choice[1]}"
    [ "${WORKLOAD_KIND}" = script ] || return 0
    [[ "${WORKLOAD_TARGET}" = /* ]] || runai_submit::err "--script ${WORKLOAD_TARGET} must be the script's absolute path in the pods: on a claim they mount (e.g. ${run_dir}/code/train.py) or in the image"
    case "${WORKLOAD_TARGET}" in
        "${data_dir}"/* | "${run_dir}"/*) ;;
        *) printf 'runai/submit.sh: note: --script %s is under neither mount point (%s, %s): the pods see it only if the image holds it\n' \
            "${WORKLOAD_TARGET}" "${data_dir}" "${run_dir}" >&2 ;;
    esac
}

# A resume, checked on this machine before any pod starts, where the runs claim is mounted here
# (RUNAI_RUN_PVC_MOUNT): the run's directory and its checkpoint must be there, and its checkpoint
# must take the trainer flags (a longer --epochs, never a shorter one; the flags that make the run
# unchanged: ddp_contract.same_run, the trainer's own rule, from checkpoint.json beside the
# checkpoint). From a machine without the claim (a laptop) nothing on it can be read: the trainer
# says the same in the pods, after the image pull and the rendezvous.
#   runai_submit::check_resume RUN LOCAL_RUN_DIR TRAINER_FLAGS...
runai_submit::check_resume() {
    local -r run="$1" here="$2"
    shift 2
    [ -d "${here}" ] || runai_submit::err "RUNAI_RESUME=${run}: there is no run ${here} (RUNAI_RUN_PVC as this machine mounts it, RUNAI_RUN_PVC_MOUNT=${RUNAI_RUN_PVC_MOUNT}): give the name the submit of that run printed, or check RUNAI_RUN_SUBDIR"
    [ -f "${here}/checkpoint.pt" ] || runai_submit::err "RUNAI_RESUME=${run}: ${here} holds no checkpoint.pt (the run stopped before its first): submit it as a new run, without RUNAI_RESUME"
    command -v python3 >/dev/null || runai_submit::err "python3 not found: it checks the run's checkpoint (RUNAI_RUN_PVC_MOUNT=${RUNAI_RUN_PVC_MOUNT}); install it or leave RUNAI_RUN_PVC_MOUNT unset"
    runai_submit::contract ddp_contract resume-check "${here}" --tag runai/submit.sh \
        --ways-out "or a new run (RUNAI_RESUME unset)" -- "$@" || exit 2  # it said why in one line
}

# CIFAR-100 onto the data claim, once: one pod of the image, no GPU, as the user (RUNAI_RUN_AS: the
# claim's homes/<user>/ are the user's), that fetches it into the data dir as `make data` does on a
# SLURM login node (python3 -m ddp_contract download: checked against the published MD5, moved
# into place whole). A standard training workload, the one-pod kind: v1 `runai submit --name NAME`
# (csub.py's form without --workers), v2 `runai training submit NAME` (run-ai/docs
# docs/Researcher/cli-reference/new-cli/runai_training_submit.md: -i, -c/--command, --existing-pvc,
# --run-as-uid, --run-as-gid, -e). RCP's pods reach the internet; where they do not, -e
# DDP_CIFAR_URL=... and DDP_CIFAR_MD5=... in RUNAI_EXTRA_ARGS name a mirror.
#   runai_submit::stage CLI NAME DATA_PATH RUN_AS SHARED_ARRAY EXTRA_ARRAY
runai_submit::stage() {
    local -r cli="$1" name="$2" data_path="$3" run_as="$4"
    local -n shared_flags="$5" extra_flags="$6"
    local -a flags=("${shared_flags[@]}" --existing-pvc "claimname=${RUNAI_DATA_PVC},path=${RUNAI_DATA_DIR:-/mnt/data}")
    if [ "${run_as}" != image ]; then
        flags+=(--run-as-uid "${run_as%%:*}" --run-as-gid "${run_as#*:}")
    fi
    local -a args logs
    if [ "${cli}" = v1 ]; then
        args=(submit --name "${name}" "${flags[@]}")
        logs=(runai logs "${name}" --follow)
    else
        args=(training submit "${name}" "${flags[@]}")
        logs=(runai training logs "${name}" --follow)
    fi
    printf 'runai/submit.sh: staging CIFAR-100 into %s (claim %s) in one pod, workload %s; submit the training once it has ended\n' \
        "${data_path}" "${RUNAI_DATA_PVC}" "${name}" >&2
    printf 'runai/submit.sh: follow it with: %s\n' "${logs[*]}" >&2
    exec runai "${args[@]}" "${extra_flags[@]}" -- python3 -m ddp_contract download "${data_path}"
}

main() {
    local -r prefix="${RUNAI_JOB_NAME:-ddp-train}"
    local -r image="${RUNAI_IMAGE:-}"
    local -r workers="${RUNAI_WORKERS:-1}"
    local -r gpus="${RUNAI_GPUS:-4}"
    local -r pod_script="${RUNAI_POD_SCRIPT:-/opt/ddp/runai/pod.sh}"
    local -r data_dir="${RUNAI_DATA_DIR:-/mnt/data}" run_dir="${RUNAI_RUN_DIR:-/mnt/runs}"
    # The image: containers/Dockerfile, built for the cluster's x86_64 nodes (docker build
    # --platform: https://docs.docker.com/reference/cli/docker/buildx/build/#platform; an arm64
    # laptop would otherwise build an image the nodes cannot run) and pushed to the registry RCP's
    # guide uses (epfml/getting-started README, "Creating Custom Docker Images": ic-registry.epfl.ch).
    [ -n "${image}" ] || runai_submit::err "RUNAI_IMAGE is unset: build and push the image from the repository root, docker build --platform linux/amd64 -f containers/Dockerfile -t ic-registry.epfl.ch/<project>/ddp-train:<tag> . && docker push ic-registry.epfl.ch/<project>/ddp-train:<tag> (after docker login ic-registry.epfl.ch), then set RUNAI_IMAGE=ic-registry.epfl.ch/<project>/ddp-train:<tag>"
    [[ "${workers}" =~ ^[0-9]+$ ]] || runai_submit::err "RUNAI_WORKERS=${workers} is not a number of worker pods"
    [[ "${gpus}" =~ ^[0-9]+$ ]] || runai_submit::err "RUNAI_GPUS=${gpus} is not a number of GPUs per pod"
    if ! [[ "${prefix}" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] || [ "${#prefix}" -gt "${RUNAI_SUBMIT_PREFIX_MAX}" ]; then
        runai_submit::err "RUNAI_JOB_NAME=${prefix} is not a workload name's prefix: lower-case letters, digits and '-', starting with a letter, ending with a letter or digit, at most ${RUNAI_SUBMIT_PREFIX_MAX} characters (the RunAI CLI takes ${RUNAI_SUBMIT_NAME_MAX}, and the submit adds -<UTC time>-<4 characters>), e.g. RUNAI_JOB_NAME=wrn-cifar"
    fi
    runai_submit::check_volume RUNAI_DATA_PVC "${RUNAI_DATA_PVC:-}" RUNAI_DATA_DIR "${data_dir}" \
        "cifar-100-python/ (stage it with ddp-train --download --data-dir DIR, in the image, in a pod that mounts it)"
    runai_submit::check_volume RUNAI_RUN_PVC "${RUNAI_RUN_PVC:-}" RUNAI_RUN_DIR "${run_dir}" \
        "the runs: checkpoints, metrics, logs (it may be the data PVC)"
    # One claim may be mounted once for both; two claims cannot share a mount point (Kubernetes
    # refuses a pod whose volumeMounts repeat a mountPath: "must be unique").
    [ "${run_dir}" != "${data_dir}" ] || [ "${RUNAI_RUN_PVC}" = "${RUNAI_DATA_PVC}" ] \
        || runai_submit::err "RUNAI_RUN_DIR and RUNAI_DATA_DIR are both ${run_dir} for two claims (${RUNAI_DATA_PVC}, ${RUNAI_RUN_PVC}): give each claim its own mount point"
    local data_subdir run_subdir
    data_subdir="$(runai_submit::subdir RUNAI_DATA_SUBDIR "${RUNAI_DATA_SUBDIR:-}" "homes/${USER:-me}/data")"
    run_subdir="$(runai_submit::subdir RUNAI_RUN_SUBDIR "${RUNAI_RUN_SUBDIR:-}" "homes/${USER:-me}/runs")"
    # A new submission is a new run, named as its workload: a run dir named after the job alone
    # would hold an earlier submission's run, which the trainer would continue or report done.
    # RUNAI_RESUME names the run to continue instead; its workload still gets a name of its own,
    # since the one that ran the run before may still exist (RunAI keeps a finished workload until
    # it is deleted).
    local name run="${RUNAI_RESUME:-}"
    name="$(runai_submit::new_name "${prefix}")"
    if [ -n "${run}" ]; then
        [[ "${run}" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] \
            || runai_submit::err "RUNAI_RESUME=${run} is not a run's name: give the directory name under the runs directory that the submit of that run printed (e.g. RUNAI_RESUME=${prefix}-20260101-120000-k3x9)"
    else
        run="${name}"
    fi
    local -r data_path="${data_dir}${data_subdir:+/${data_subdir}}"
    local -r run_path="${run_dir}${run_subdir:+/${run_subdir}}/${run}"
    # The pods' user. RCP's csub.py always passes --run-as-uid and --run-as-gid, the user's LDAP
    # ids, which it takes from its configuration, never from the submitting machine
    # (epfml/getting-started, csub.py: LDAP_UID, LDAP_GID from .env; its README, "Find your LDAP
    # UID": `id` on haas001.rcp.epfl.ch). The scratch claim's homes/<user>/ are the user's, and a pod
    # running as another uid (a laptop's 501:20, root's 0:0, the image's user) may not write there.
    # This machine's ids are no guide to the cluster's, so RUNAI_RUN_AS has no default.
    local -r run_as="${RUNAI_RUN_AS:-}"
    [ -n "${run_as}" ] || runai_submit::err "RUNAI_RUN_AS is unset: set it to your uid and gid on the cluster, RUNAI_RUN_AS=UID:GID (on RCP: ssh <user>@haas001.rcp.epfl.ch id prints them, the uid= and gid= numbers; RCP's csub.py takes the same two as LDAP_UID and LDAP_GID), or RUNAI_RUN_AS=image for the image's own user"
    [[ "${run_as}" =~ ^[0-9]+:[0-9]+$ || "${run_as}" = image ]] \
        || runai_submit::err "RUNAI_RUN_AS=${run_as} is neither UID:GID nor image: give the numeric user and group the pods run as (on RCP your LDAP ids, from id on haas001.rcp.epfl.ch), or image to keep the image's user"
    # `--download` alone stages the data instead of training (the trainer's own flag: fetch CIFAR-100
    # into the data dir and exit).
    local download=0
    if [[ " $* " = *" --download "* ]]; then
        [ "$#" -eq 1 ] || runai_submit::err "--download stages CIFAR-100 on the data claim and takes no other trainer flags: run runai/submit.sh --download alone, then submit the training"
        [ -z "${RUNAI_RESUME:-}" ] || runai_submit::err "--download stages the data and continues no run: leave RUNAI_RESUME unset for it"
        download=1
    fi
    if [ -n "${RUNAI_RESUME:-}" ] && [ -n "${RUNAI_RUN_PVC_MOUNT:-}" ]; then
        [[ "${RUNAI_RUN_PVC_MOUNT}" = /* ]] || runai_submit::err "RUNAI_RUN_PVC_MOUNT=${RUNAI_RUN_PVC_MOUNT} must be an absolute path: where this machine mounts ${RUNAI_RUN_PVC} (on RCP's haas001.rcp.epfl.ch, /mnt/mlo/scratch)"
        runai_submit::check_resume "${run}" "${RUNAI_RUN_PVC_MOUNT%/}${run_subdir:+/${run_subdir}}/${run}" "$@"
    fi
    local -a extra=()
    runai_submit::split_words extra RUNAI_EXTRA_ARGS
    case "${RUNAI_CLI:-}" in
        ""|v1|v2) ;;
        *) runai_submit::err "RUNAI_CLI=${RUNAI_CLI} is neither v1 (runai submit-dist pytorch) nor v2 (runai training pytorch submit); leave it unset to use the installed CLI's" ;;
    esac
    command -v runai >/dev/null || runai_submit::err "runai CLI not found: install it from your RunAI cluster's web UI (CLI v1 2.13 or newer, or v2)"
    local cli="${RUNAI_CLI:-}"
    [ -n "${cli}" ] || cli="$(runai_submit::cli)" || exit 2

    # What both CLIs take under the same names (each reference's flag below: v1, runai submit-dist
    # pytorch, https://docs.run.ai/v2.18/Researcher/cli-reference/runai-submit-dist-pytorch/ and
    # RCP's use of it, epfml/getting-started docs/multinode.md and csub.py; v2, runai training
    # pytorch submit, run-ai/docs docs/Researcher/cli-reference/new-cli/runai_training_pytorch_submit.md,
    # now https://docs.nvidia.com/run-ai/self-hosted/reference/cli/runai/training/runai-training-pytorch-submit).
    # -i IMAGE: v1 "-i | --image", v2 "-i, --image string".
    # --command: without it RunAI appends what follows `--` to the image's ENTRYPOINT
    # (ddp-launch), so every pod would run `ddp-launch /opt/ddp/runai/pod.sh ...` and exit 2;
    # with it, what follows `--` replaces the ENTRYPOINT (v1: "--command: Overrides the image's
    # entry point with the command supplied after '--'"; v2: "-c, --command  If true, override the
    # image's entrypoint with the command supplied after '--'"; Kubernetes' command/args).
    local -a shared=(-i "${image}" --command)
    if [ "${download}" = 1 ]; then
        runai_submit::stage "${cli}" "${name}" "${data_path}" "${run_as}" shared extra
    fi
    # Kubernetes gives a pod a 64 MiB /dev/shm; NCCL's shared-memory transport between the
    # GPUs of one pod needs far more and fails with "unhandled system error" (NCCL
    # troubleshooting, "Docker/shared memory"). --large-shm mounts a memory-backed /dev/shm
    # (v1 "--large-shm: Mount a large /dev/shm device", v2 "--large-shm").
    if [ "${RUNAI_LARGE_SHM:-1}" = 1 ]; then
        shared+=(--large-shm)
    fi
    # RCP's RoCE: the pods join kube-system/roce and get an RDMA device (epfml/getting-started,
    # docs/multinode.md); v1 "-a | --annotation", "--extended-resource <resource-name>=<quantity>",
    # v2 "--annotation stringArray", "--extended-resource stringArray  resource_name=quantity".
    if [ "${RUNAI_RDMA:-1}" = 1 ]; then
        shared+=(--annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1)
    else
        # No RoCE: NCCL's own switch to IP sockets, which ddp-launch and doctor read as "no RDMA device expected".
        shared+=(-e NCCL_IB_DISABLE=1)
    fi
    # Existing PVCs: --existing-pvc claimname=NAME,path=PATH in both (v2: "Mount an existing
    # persistent volume. Use the format: claimname=CLAIM_NAME,path=PATH"; --pvc in v1 instead
    # creates a claim from a storage class). pod.sh reads DDP_DATA_DIR and DDP_RUN_DIR
    # (-e NAME=VALUE: v1 "-e | --environment", v2 "-e, --environment stringArray  Set environment
    # variables in the container").
    shared+=(--existing-pvc "claimname=${RUNAI_DATA_PVC},path=${data_dir}")
    if [ "${run_dir}" != "${data_dir}" ]; then
        shared+=(--existing-pvc "claimname=${RUNAI_RUN_PVC},path=${run_dir}")
    fi
    shared+=(-e "DDP_DATA_DIR=${data_path}" -e "DDP_RUN_DIR=${run_path}")
    # v2 "--run-as-uid int  The user ID the container will run with", "--run-as-gid int"; v1 takes
    # the same two, as csub.py passes them to runai submit-dist pytorch.
    if [ "${run_as}" != image ]; then
        shared+=(--run-as-uid "${run_as%%:*}" --run-as-gid "${run_as#*:}")
    fi
    # Where the two differ: v1 names the workload with --name and counts GPUs with -g (a float,
    # "-g | --gpu"); v2 takes the name as its argument and GPU devices as -g, --gpu-devices-request
    # (int32). Both count --workers as the pods besides the master (v2 has --no-master to drop it).
    local -a args logs
    if [ "${cli}" = v1 ]; then
        args=(submit-dist pytorch --name "${name}" --workers="${workers}" -g "${gpus}" "${shared[@]}")
        logs=(runai logs "${name}" --follow)
    else
        args=(training pytorch submit "${name}" --workers "${workers}" --gpu-devices-request "${gpus}" "${shared[@]}")
        logs=(runai training pytorch logs "${name}" --follow)
    fi
    # The trainer's --resume: with it, a run dir without a checkpoint (a mistyped name) is an error
    # in one line rather than a new run (src/ddp_train/checkpoint.py). A script of the user's gets exactly
    # its arguments, and is told by DDP_RESUME=1 instead (ddp_contract.workload.resuming()).
    local -a resume=()
    runai_submit::workload "${data_dir}" "${run_dir}" "$@"
    if [ -n "${RUNAI_RESUME:-}" ]; then
        if [ "${WORKLOAD_KIND}" = builtin ]; then
            resume=(--resume)
        else
            args+=(-e DDP_RESUME=1)
        fi
        printf 'runai/submit.sh: continuing run %s in %s, as workload %s\n' "${run}" "${run_path}" "${name}" >&2
    else
        printf 'runai/submit.sh: a new run, %s, in %s (RUNAI_RESUME=%s continues it)\n' "${run}" "${run_path}" "${run}" >&2
    fi
    # The logs: v1 "runai logs JOB_NAME", -f/--follow (run-ai/runai-cli cmd/logs/logs.go); v2
    # "runai training pytorch logs WORKLOAD_NAME --follow" (run-ai/docs new-cli/runai_pytorch_logs.md).
    if [ "${run_as}" != image ]; then
        printf "runai/submit.sh: its pods run as %s (RUNAI_RUN_AS=UID:GID changes it, RUNAI_RUN_AS=image keeps the image's user)\n" "${run_as}" >&2
    fi
    printf 'runai/submit.sh: follow it with: %s\n' "${logs[*]}" >&2
    exec runai "${args[@]}" "${extra[@]}" -- "${pod_script}" "${resume[@]}" "$@"
}

main "$@"
