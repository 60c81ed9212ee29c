# shellcheck shell=bash
# Shared shell for the job scripts in slurm/: settings, checks, the training step,
# the per-node GPU sampler and requeue. Sourced, never run; messages go to stderr.
#
# A job script's header is one line that sources this file from the checkout:
#   source "${DDP_REPO:-${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}}/slurm/lib/ddp.sh"
# (sbatch runs a spooled copy of the script, so the checkout is found from the submit
# directory, or DDP_REPO). Its arguments are the WORKLOAD's, passed as "$@": the built-in trainer's flags,
#   sbatch slurm/olivia-multinode.sh --epochs 5 --batch-size 1024
# or, named first, your own script (or module) and exactly its arguments (docs/own-script.md):
#   sbatch slurm/olivia-multinode.sh --script train.py --lr 0.1
# ddp-launch flags go in DDP_LAUNCH_ARGS:
#   DDP_LAUNCH_ARGS="--max-restarts 2" sbatch slurm/olivia-multinode.sh
# The workload is read once (python3 -m ddp_contract.workload_choice), and every step knows it: the preflight
# checks what it needs, the fabric gate runs our own module whatever it is (in the built-in trainer's own
# ranks, or as a step of its own before a script of yours), the training step runs it.
#
# Settings (environment or sbatch --export win over each script's defaults):
#   DDP_REPO        the checkout holding this file (set from where it was sourced)
#   DDP_IMAGE       the SIF to run              DDP_SITE      site profile (binds, fabric)
#   DDP_DATA_DIR    holds cifar-100-python/ (your script's data: any directory, bound in where it exists)
#   DDP_RUN_DIR     metrics, checkpoint, logs; a script of yours gets both as variables, not flags
#                   (both made absolute; ',' and ':' are refused: APPTAINER_BIND cannot carry them;
#                   DDP_RUN_DIR may name the job as sbatch --output does: %j, %A, %a, %%; a job
#                   array's tasks need %a or %j there, one run dir per task: runs/sweep-%A_%a)
#   DDP_CONTAINER_RUNTIME apptainer (default) or singularity (SingularityCE, LUMI's): the command
#                   the steps run, and the variable the binds go in (APPTAINER_BIND, SINGULARITY_BIND)
#   DDP_APPTAINER_MODULE  module that provides that command, loaded when it is not on PATH
#   DDP_TRAIN_ARGS  the workload's arguments before the job script's (which win); unset, the built-in trainer
#                   gets the script's own defaults (ddp::trainer_defaults), your script none; set empty: none
#   DDP_LAUNCH_ARGS ddp-launch flags (a --script or --module there names the workload as well)
#   DDP_VENV        a virtual environment made in the image (--system-site-packages) whose packages the
#                   workload sees: bound in, and ddp-launch runs in its Python (docs/own-script.md)
#                   (both are words with the shell's quoting: DDP_TRAIN_ARGS='--compile-cache-dir "/scratch/my cache"')
#   DDP_CPU_WORKERS ddp-launch --cpu-workers (CPU workers per node; unset: one per GPU)
#   DDP_GPU         1 runs apptainer with the site's GPU flag (default: --nv, --rocm for an
#                   AMD site; python3 -m ddp_launch.accelerators), 0 without
#   DDP_MONITOR_INTERVAL  GPU sampling period in seconds (0 disables the sampler)
#   DDP_MAX_REQUEUES      requeues after a stop signal or without a bad node, counted by SLURM_RESTART_COUNT (3)
#   DDP_STEP_WAIT         seconds the other tasks get to end after the first one ends (30)
#   DDP_NODE_PROBE_S      seconds a node the roll call names has to run a step of `true`, or be lost (20)
#   DDP_PREFLIGHT         1 runs `ddp-launch doctor` on every node first (default), 0 skips it
#   DDP_FABRIC_GATE       1 runs the fabric gate before training (default; the built-in trainer's first thing,
#                         a step of its own for your script), 0 skips it
#   DDP_TRAIN_NODES       N, the nodes the training runs on: each script's default is its #SBATCH --nodes
#   DDP_SPARE_NODES       S spare nodes in the allocation (default 0), on top of the N. Ask SLURM for N + S nodes:
#                   DDP_SPARE_NODES=1 sbatch --nodes=3 slurm/olivia-multinode.sh   (2 train, 1 spare)
#                   An allocation without room for them (sbatch --nodes=N+S forgotten) stops in one line, exit 2,
#                   before any step; more than N + S nodes train on all but S, as sbatch --nodes=K does without
#                   spares. The training runs on the first healthy nodes; a node the preflight, the fabric gate or
#                   a lost node's roll call names is replaced by a spare inside the allocation, and the training
#                   resumes from the last checkpoint with the same global batch. With no spare left (S=0 too):
#                   the requeue without the node (exit 76, within DDP_MAX_REQUEUES).
#                   The scripts' `#SBATCH --no-kill` keeps the job when a node fails (sbatch(1)).
set -euo pipefail

# ddp_contract.EXIT_USAGE (entrypoints/ddp_contract): a mistake the user can fix, said in one line and
# never retried; runai/submit.sh and ddp-launch stop with it too.
readonly DDP_EXIT_USAGE=2
# ddp_contract.EXIT_REQUEUE (entrypoints/ddp_contract): every worker checkpointed on a stop signal.
readonly DDP_EXIT_REQUEUE=75
# ddp_contract.EXIT_BAD_NODE: the preflight, the fabric gate or a lost node's roll call named a node;
# requeue without it.
readonly DDP_EXIT_BAD_NODE=76
# ddp_contract.STOP_REQUEST_FILE: in the run dir, a stop the batch script asks of the trainer.
readonly DDP_STOP_REQUEST_FILE=.ddp-stop-request
# In the run dir: "JOB N", the number of step ids job JOB has taken so far (ddp::take_step_id).
readonly DDP_STEP_IDS_FILE=.ddp-step-ids
# ddp_contract.ROLL_CALL_REPORT: in the run dir, the nodes a failed collective's roll call found gone.
readonly DDP_ROLL_CALL_REPORT=roll-call.json
# ddp_contract.LAUNCHER_CRASH_REPORT: a node's ddp-launch ended the step, its workers killed or on a line of
# its own (the node is up; ddp_contract.launcher_reports).
readonly DDP_LAUNCHER_CRASH_REPORTS='launcher-crash-*.json'

ddp::log() {
    printf '%s: %s\n' "${DDP_LOG_TAG:-ddp}" "$*" >&2
}

ddp::err() {
    ddp::log "error: $*"
    exit "${DDP_EXIT_USAGE}"
}

# Keep a value the user already set (environment, sbatch --export); else the default.
ddp::default() {
    local -r name="$1" value="$2"
    export "${name}=${!name:-${value}}"
}

# The built-in trainer's flags for this job script, used where DDP_TRAIN_ARGS is unset (an empty
# DDP_TRAIN_ARGS means no flags) and only when the workload is the built-in trainer: a script of the user's
# gets exactly the user's arguments.
#   ddp::trainer_defaults "FLAGS"
ddp::trainer_defaults() {
    DDP_TRAINER_DEFAULT_ARGS="$1"
}
# shellcheck disable=SC2034 # read by name: ddp::split_words in ddp::workload_words
DDP_TRAINER_DEFAULT_ARGS=""

# The checkout is where this file was sourced from: the job script found it there.
DDP_REPO="$(CDPATH="" cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)"
export DDP_REPO

# The launcher's host half (site profiles, binds, the dataset check) straight from the
# checkout, run by the node's own python3 (3.6 on SLES 15): `python3 -m MODULE`, not the
# full CLI, so only the modules in entrypoints/host-modules.txt load (make lint checks
# them for 3.6).
ddp::on_host() {
    local -r module="$1"
    shift
    PYTHONPATH="${DDP_REPO}/entrypoints${PYTHONPATH:+:${PYTHONPATH}}" python3 -m "${module}" "$@"
}

ddp::export_binds() {
    local -r site="$1"
    shift
    local binds path
    # The user's own binds come first, read as DDP_RUNTIME reads them: SingularityCE's SINGULARITY_BIND;
    # Apptainer's APPTAINER_BIND, or SINGULARITY_BIND where that is unset (ddp_launch.binds, user_binds).
    binds="$(ddp::on_host ddp_launch.binds --site "${site}" --runtime "${DDP_RUNTIME}")" \
        || ddp::err "ddp-launch binds --site ${site} --runtime ${DDP_RUNTIME} failed (see above)"
    for path in "$@"; do
        binds="${binds:+${binds},}${path}:${path}"
    done
    # Each runtime reads its own variable: APPTAINER_BIND (Apptainer user guide, "Bind Paths and
    # Mounts", https://apptainer.org/docs/user/main/bind_paths_and_mounts.html), SINGULARITY_BIND
    # (SingularityCE user guide, same section, https://docs.sylabs.io/guides/latest/user-guide/bind_paths_and_mounts.html).
    local -r variable="${DDP_RUNTIME^^}_BIND"
    export "${variable}=${binds}"
    ddp::log "${variable}=${binds}"
}

# Apptainer's GPU flag for the site's vendor (--nv, --rocm: Apptainer user guide, "GPU Support"),
# from the site profile's accelerator, so a job script never writes it.
# Sets DDP_GPU_FLAG (not printed: ddp::err must stop the job, not a command substitution).
ddp::gpu_flag() {
    local -r site="$1"
    DDP_GPU_FLAG="$(ddp::on_host ddp_launch.accelerators --site "${site}" apptainer-flag)" \
        || ddp::err "python3 -m ddp_launch.accelerators --site ${site} apptainer-flag failed (see above)"
}

# The site's options for the srun of its training and gate steps, from the site profile's
# "srun_args" (Slingshot: --network=disable_rdzv_get, which HPE's FI_CXI_RDZV_PROTO=alt_read needs),
# so a job script never writes them. Sets the array DDP_SITE_SRUN_ARGS, and DDP_SITE_NETWORK to the
# value of its --network (ddp::launch_step passes it on to ddp-launch).
ddp::site_srun_args() {
    local -r site="$1"
    local words word
    words="$(ddp::on_host ddp_launch.sites --site "${site}" srun-args)" \
        || ddp::err "python3 -m ddp_launch.sites --site ${site} srun-args failed (see above)"
    DDP_SITE_SRUN_ARGS=()
    if [ -n "${words}" ]; then
        mapfile -t DDP_SITE_SRUN_ARGS <<< "${words}"
    fi
    DDP_SITE_NETWORK=""
    for word in "${DDP_SITE_SRUN_ARGS[@]}"; do
        case "${word}" in
            --network=*) DDP_SITE_NETWORK="${word#--network=}" ;;
        esac
    done
}

# Apptainer comes from a module on most clusters (MPCDF Raven: `module load apptainer`);
# without it the job would fail only inside srun, once per node. A script that knows
# its site's module sets DDP_APPTAINER_MODULE, and the module is loaded when needed.
# LUMI has SingularityCE's `singularity` in the OS and no `apptainer`
# (https://docs.lumi-supercomputer.eu/software/containers/singularity/): its script sets
# DDP_CONTAINER_RUNTIME=singularity. Both take the `run`/`exec` options the steps use
# (--nv, --rocm, binds through the environment).
ddp::require_runtime() {
    DDP_RUNTIME="${DDP_CONTAINER_RUNTIME:-apptainer}"
    case "${DDP_RUNTIME}" in
        apptainer | singularity) ;;
        *) ddp::err "DDP_CONTAINER_RUNTIME=${DDP_RUNTIME} is not a runtime the job scripts run: use apptainer or singularity (SingularityCE)" ;;
    esac
    local -r module="${DDP_APPTAINER_MODULE:-}"
    if ! command -v "${DDP_RUNTIME}" >/dev/null && [ -n "${module}" ] && type module >/dev/null 2>&1; then
        module load "${module}" >/dev/null 2>&1 || true
    fi
    command -v "${DDP_RUNTIME}" >/dev/null \
        || ddp::err "${DDP_RUNTIME} is not on PATH: run 'module load ${module:-${DDP_RUNTIME}}' (or set DDP_APPTAINER_MODULE to your site's module) before sbatch"
}

# APPTAINER_BIND is "src:dst,src:dst" with absolute paths: a relative directory, or one
# with ',' or ':', would break every bind (Apptainer user guide, "Bind Paths and Mounts").
ddp::absolute_dir_setting() {
    local -r name="$1"
    local path="${!name}"
    [ -n "${path}" ] || ddp::err "${name} is empty: set it to a directory"
    case "${path}" in
        /*) ;;
        *) path="${PWD}/${path}" ;;
    esac
    case "${path}" in
        *,* | *:*) ddp::err "${name}=${path} contains ',' or ':', which APPTAINER_BIND cannot carry: use a path without them (a symlink to it works)" ;;
    esac
    export "${name}=${path}"
}

# DDP_RUN_DIR with sbatch's filename patterns that name the job filled in (sbatch(1), "filename
# pattern"): %j the job id, %A the array's job id (the job id outside an array), %a the array task,
# %% a '%'. The tasks of a job array share the environment they were submitted with, so a run dir
# without %a or %j would be every task's: the second would stop at the run-dir lock, or, when the
# first had finished, resume its run. In an array the setting must name the task.
ddp::expand_run_dir() {
    local -r given="${DDP_RUN_DIR}" task="${SLURM_ARRAY_TASK_ID:-}"
    local rest="${given}" out="" symbol names_task=0
    while [[ "${rest}" == *%* ]]; do
        out+="${rest%%\%*}"
        rest="${rest#*%}"
        symbol="${rest:0:1}"
        rest="${rest:1}"
        case "${symbol}" in
            %) out+=% ;;
            j)
                out+="${SLURM_JOB_ID:-local}"
                names_task=1
                ;;
            A) out+="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-local}}" ;;
            a)
                [ -n "${task}" ] || ddp::err "DDP_RUN_DIR=${given} names an array task (%a), but job ${SLURM_JOB_ID:-local} is not a job array: submit it with sbatch --array=..., or leave %a out"
                out+="${task}"
                names_task=1
                ;;
            *) ddp::err "DDP_RUN_DIR=${given}: '%${symbol}' is not a pattern the job scripts fill in: use %j (the job), %A (the array job), %a (the array task) or %% (a '%'), as in sbatch(1)'s filename patterns" ;;
        esac
    done
    if [ -n "${task}" ] && [ "${names_task}" = 0 ]; then
        ddp::err "DDP_RUN_DIR=${given} is the same directory for every task of job array ${SLURM_ARRAY_JOB_ID:-?}: name the task in it with %a (DDP_RUN_DIR='runs/sweep-%A_%a'), so each task trains its own run"
    fi
    export DDP_RUN_DIR="${out}${rest}"
}

# The job as scontrol must name it. Each task of a job array has its own SLURM_JOB_ID, but the first
# task's equals SLURM_ARRAY_JOB_ID, and scontrol given that id acts on the whole array: a requeue of
# task 0 would requeue every task (Lightning-AI/pytorch-lightning#15022). "<array job id>_<task id>"
# names one task (https://slurm.schedmd.com/job_array.html, "Job ID and Environment Variables").
ddp::job_ref() {
    if [ -n "${SLURM_ARRAY_JOB_ID:-}" ] && [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then
        printf '%s_%s\n' "${SLURM_ARRAY_JOB_ID}" "${SLURM_ARRAY_TASK_ID}"
    else
        printf '%s\n' "${SLURM_JOB_ID}"
    fi
}

# The make target that builds an image of this name: the Makefile's OLIVIA_SIF, LUMI_SIF, X86_SIF and
# CPU_SIF, the images the job scripts name (tests/bats/job_scripts.bats checks the two agree).
ddp::image_target() {
    case "$(basename -- "$1")" in
        train-olivia-arm64.sif) printf 'build-olivia\n' ;;
        train-lumi-x86_64.sif) printf 'build-lumi\n' ;;
        train-x86_64.sif) printf 'build-x86\n' ;;
        train-cpu.sif) printf 'build-cpu\n' ;;
    esac
}

ddp::require_image() {
    local -r image="$1"
    [ ! -f "${image}" ] || return 0
    local -r target="$(ddp::image_target "${image}")" dir="$(dirname -- "${image}")"
    local where=""
    [ "${dir}" -ef "${DDP_REPO}" ] || where=" SIF_DIR=${dir}"
    if [ "${target}" = build-lumi ]; then
        # LUMI allows no fakeroot, so `make build-lumi` cannot run there: "building containers on LUMI
        # is, unfortunately, not in general possible" (https://docs.lumi-supercomputer.eu/software/containers/singularity/).
        ddp::err "image ${image} not found: LUMI allows no fakeroot, so the LUMI image is built elsewhere: run 'make build-lumi' in a checkout on a machine with Apptainer 1.3 or newer (containers/README.md) and copy train-lumi-x86_64.sif to ${dir}, or set DDP_IMAGE"
    fi
    if [ -n "${target}" ]; then
        ddp::err "image ${image} not found: build it in the checkout (make ${target}${where}; containers/README.md) or set DDP_IMAGE"
    fi
    ddp::err "image ${image} not found: build it in the checkout (make build-olivia, build-lumi, build-x86 or build-cpu, whichever fits the site; containers/README.md) or set DDP_IMAGE"
}

# The job's workload, read once from its arguments and DDP_LAUNCH_ARGS's words (ddp_contract.workload_choice):
# DDP_WORKLOAD (builtin, script or module), DDP_WORKLOAD_FLAGS (ddp-launch's --script PATH or --module MOD, none
# for the built-in trainer), DDP_WORKLOAD_ARGS (its own arguments); DDP_LAUNCH_WORDS keeps ddp-launch's other
# flags, which the fabric gate's step shares. A script's path is made absolute here, from the directory the job
# was submitted from (srun's and the container's working directory too), and must be a readable file.
#   ddp::read_workload ARGS...
ddp::read_workload() {
    local -a out=()
    mapfile -t -d '' out < <(ddp::on_host ddp_contract.workload_choice --check-file "${DDP_LOG_TAG:-ddp}" \
        "${#DDP_LAUNCH_WORDS[@]}" "${DDP_LAUNCH_WORDS[@]}" "$@")
    [ "${#out[@]}" -ge 4 ] && [ -z "${out[-1]}" ] || exit "${DDP_EXIT_USAGE}"  # python3 said why on stderr
    unset 'out[-1]'
    DDP_WORKLOAD="${out[0]}"
    local -r count="${out[2]}"
    DDP_LAUNCH_WORDS=("${out[@]:3:count}")
    DDP_WORKLOAD_ARGS=("${out[@]:3+count}")
    DDP_WORKLOAD_FLAGS=()
    if [ "${DDP_WORKLOAD}" != builtin ]; then
        DDP_WORKLOAD_FLAGS=("--${DDP_WORKLOAD}" "${out[1]}")
    fi
}

# The workload's arguments before the job's: DDP_TRAIN_ARGS's words where it is set (empty: none), else the
# job script's defaults for the built-in trainer, and none for a workload of the user's.
ddp::workload_words() {
    if [ -n "${DDP_TRAIN_ARGS+set}" ]; then
        ddp::split_words DDP_TRAIN_WORDS DDP_TRAIN_ARGS
    elif [ "${DDP_WORKLOAD}" = builtin ]; then
        ddp::split_words DDP_TRAIN_WORDS DDP_TRAINER_DEFAULT_ARGS
    else
        DDP_TRAIN_WORDS=()
    fi
}

# A user's workload: DDP_DATA_DIR is its data where that directory exists (bound in, exported), else the job
# has none to give it. DDP_VENV, where set, must be a directory (ddp-launch checks it is a venv, in the image).
ddp::workload_dirs() {
    if [ "${DDP_WORKLOAD}" != builtin ]; then
        if [ -n "${DDP_DATA_DIR:-}" ] && [ -d "${DDP_DATA_DIR}" ]; then
            ddp::absolute_dir_setting DDP_DATA_DIR
        else
            [ -z "${DDP_DATA_DIR:-}" ] || ddp::log "DDP_DATA_DIR=${DDP_DATA_DIR} does not exist: the workload gets no DDP_DATA_DIR"
            unset DDP_DATA_DIR
        fi
    fi
    if [ -n "${DDP_VENV:-}" ]; then
        [ -d "${DDP_VENV}" ] || ddp::err "DDP_VENV=${DDP_VENV} is not a directory: make the venv in the image first (apptainer exec IMAGE python3 -m venv --system-site-packages --without-pip ${DDP_VENV}; docs/own-script.md), or unset DDP_VENV"
        ddp::absolute_dir_setting DDP_VENV
    fi
}

# Compute nodes are often offline: the data must be staged before the job starts.
# The trainer's own list of files decides (ddp_contract.DATASET_FILES).
ddp::require_data() {
    local -r data_dir="$1"
    local missing
    missing="$(ddp::on_host ddp_contract dataset "${data_dir}")" \
        || ddp::err "${missing:-the dataset check failed (see above)}: run 'make data DATA_DIR=${data_dir}' on the login node, or set DDP_DATA_DIR"
}

# DDP_LAUNCH_ARGS and DDP_TRAIN_ARGS as words, split once before the job does anything;
# `apptainer run` and its options, shared by every step.
DDP_LAUNCH_WORDS=()
DDP_TRAIN_WORDS=()
DDP_WORKLOAD=builtin   # ddp::read_workload: builtin, script or module
DDP_WORKLOAD_FLAGS=()  # ddp-launch's words that name it (none for the built-in trainer)
DDP_WORKLOAD_ARGS=()   # its own arguments, after DDP_TRAIN_ARGS's words
DDP_APPTAINER_ARGS=(run)
DDP_SITE_SRUN_ARGS=()  # the site profile's srun options (ddp::site_srun_args)
DDP_SITE_NETWORK=""    # the value of their --network, if any
DDP_RUNTIME=apptainer  # DDP_CONTAINER_RUNTIME, checked by ddp::require_runtime

# A settings variable's words, by the shell's quoting rules but with no expansion or command
# run (entrypoints/ddp_contract/shell_words.py, the rule runai/submit.sh uses too):
# DDP_TRAIN_ARGS='--compile-cache-dir "/a b"' is two words. They come back NUL-terminated, then
# one empty word that says the split succeeded: a process substitution's exit status cannot
# be read in bash 4.4 (SLES 15).
#   ddp::split_words ARRAY_NAME VARIABLE_NAME
ddp::split_words() {
    local -n into="$1"
    local -r name="$2"
    into=()
    [ -n "${!name:-}" ] || return 0
    mapfile -t -d '' into < <(ddp::on_host ddp_contract.shell_words "${DDP_LOG_TAG:-ddp}" "${name}" "${!name}")
    [ "${#into[@]}" -gt 0 ] && [ -z "${into[-1]}" ] || exit "${DDP_EXIT_USAGE}"  # python3 said why on stderr
    unset 'into[-1]'
}

# One job per run dir: the trainer holds <run-dir>/.ddp-run.lock while it runs
# (entrypoints/ddp_contract/rundir_lock.py says why a file and not flock). A second job
# stops here, exit 2 in one line, before its sampler or logs write anything there. The lock names
# its job by DDP_JOB_ID, which ddp-launch sets in the steps from the same SLURM job id
# (ddp_launch/schedulers/slurm.py, identity): a requeue of this job finds its own lock.
ddp::require_free_run_dir() {
    local -r run_dir="$1"
    local status=0
    DDP_JOB_ID="${DDP_JOB_ID:-${SLURM_JOB_ID:-}}" ddp::on_host ddp_contract run-dir-lock "${run_dir}" || status=$?
    [ "${status}" -eq 0 ] || exit "${status}"
}

# A run dir whose checkpoint cannot be resumed with the trainer flags (another --width-scale, a shorter
# --epochs: ddp_contract.same_run, the trainer's own rule) stops here in one line, exit 2, before any
# step; the trainer would say the same after the preflight, the gate and the rendezvous. A requeue
# has the same flags and passes. The built-in trainer's only.
#   ddp::require_resumable RUN_DIR TRAIN_ARGS...
ddp::require_resumable() {
    local -r run_dir="$1"
    shift
    local -r ways_out="another DDP_RUN_DIR, or --no-resume (which keeps this run, moved aside into {run_dir}/checkpoint-<UTC time>/)"
    local status=0
    ddp::on_host ddp_contract resume-check "${run_dir}" --tag "${DDP_LOG_TAG:-ddp}" --ways-out "${ways_out}" \
        -- "${DDP_TRAIN_WORDS[@]}" "$@" || status=$?
    [ "${status}" -eq 0 ] || exit "${status}"
}

ddp::print_job() {
    ddp::log "job ${SLURM_JOB_ID:-?} on ${SLURM_JOB_NUM_NODES:-1} node(s): ${SLURM_JOB_NODELIST:-$(hostname -s)}" \
        "(restart ${SLURM_RESTART_COUNT:-0})"
    ddp::log "image ${DDP_IMAGE}, site ${DDP_SITE}, data ${DDP_DATA_DIR:-none}, run ${DDP_RUN_DIR}"
    if [ "${DDP_WORKLOAD}" != builtin ]; then
        ddp::log "workload: ${DDP_WORKLOAD_FLAGS[*]}, with ${#DDP_TRAIN_WORDS[@]} + ${#DDP_WORKLOAD_ARGS[@]} argument(s) of its own (DDP_TRAIN_ARGS, the job's)${DDP_VENV:+, in DDP_VENV=${DDP_VENV}}"
    fi
}

# Step ids across requeues. A requeued job keeps its id and numbers its steps from 0 again
# (slurmctld's batch_requeue_fini resets next_step_id; https://github.com/SchedMD/slurm,
# src/slurmctld/job_mgr.c). A signal that slurmctld could not deliver to a node (srun's SIGKILL of
# a step on a node that dropped off the network) waits in its retry list and is sent again every
# 60 s until the node answers (src/slurmctld/agent.c, RPC_RETRY_INTERVAL), and it names only the
# job and the step id (REQUEST_SIGNAL_TASKS). Once the node is back, it kills whatever step of the
# requeued run has that id there. So every run writes down, before each step, how many step ids the
# job has taken, and a requeued run first uses up its predecessors' ids with steps that do nothing:
# none of its own steps can then be the target of a late kill.
DDP_STEP_IDS_TAKEN=0

# Record one more step id taken, before the srun that takes it (a run killed by NODE_FAIL never
# reaches its end, so the record is kept current rather than written at exit).
ddp::take_step_id() {
    [ -n "${SLURM_JOB_ID:-}" ] || return 0
    DDP_STEP_IDS_TAKEN=$((DDP_STEP_IDS_TAKEN + 1))
    ddp::write_step_ids
}

ddp::write_step_ids() {
    local -r record="${DDP_RUN_DIR}/${DDP_STEP_IDS_FILE}"
    if ! { printf '%s %s\n' "${SLURM_JOB_ID}" "${DDP_STEP_IDS_TAKEN}" > "${record}.tmp" \
        && mv -f "${record}.tmp" "${record}"; }; then
        ddp::log "warning: cannot record the job's step ids in ${record}: a requeue of this job may reuse them"
    fi
}

# In a requeued run: steps that only print their id, all at once, until the ids the runs before
# took are used up (a step that SLURM could not create takes none, hence the check).
ddp::skip_used_step_ids() {
    [ -n "${SLURM_JOB_ID:-}" ] || return 0
    local -r record="${DDP_RUN_DIR}/${DDP_STEP_IDS_FILE}"
    local job="" used=0 highest=-1 id
    [ ! -r "${record}" ] || read -r job used < "${record}" || true
    if [ "${job}" != "${SLURM_JOB_ID}" ] || ! [[ "${used}" =~ ^[0-9]+$ ]] || [ "${used}" -eq 0 ]; then
        DDP_STEP_IDS_TAKEN=0
        ddp::write_step_ids
        return 0
    fi
    local -r started="${SECONDS}"
    for _ in 1 2 3; do
        while read -r id; do
            [[ "${id}" =~ ^[0-9]+$ ]] && [ "${id}" -gt "${highest}" ] && highest="${id}"
        done < <(
            for ((id = highest + 1; id < used; id++)); do
                srun --overlap --nodes=1 --ntasks=1 --kill-on-bad-exit=0 printenv SLURM_STEP_ID 2>/dev/null &
            done
            wait
        )
        [ "$((highest + 1))" -lt "${used}" ] || break
    done
    if [ "$((highest + 1))" -lt "${used}" ]; then
        ddp::log "warning: could not skip the step ids 0-$((used - 1)) of this job's earlier runs (reached $((highest + 1))): a late kill of one of them could end this run"
        highest=$((used - 1))
    fi
    DDP_STEP_IDS_TAKEN=$((highest + 1))
    ddp::write_step_ids
    ddp::log "restart ${SLURM_RESTART_COUNT:-?}: skipped step ids 0-$((used - 1)), which this job's earlier runs used (a kill SLURM could not deliver then cannot reach this run's steps; $((SECONDS - started)) s)"
}

# One sampler per node as an overlapping job step; DDP_MONITOR_PID is the srun that
# runs them, and killing it (by PID) stops every node's sampler. --ntasks as well, as in the
# preflight and in MPCDF's tutorial (`srun --ntasks=${SLURM_NNODES} --ntasks-per-node=1`): the step
# inherits the job's SLURM_NTASKS (8 on Raven's 2 x 4), "Same as -n, --ntasks" for srun, and "the
# --ntasks option will take precedence and the --ntasks-per-node will be treated as a maximum"
# (srun(1)): an srun that applies that rule to the inherited count (older ones say "can't honor
# --ntasks-per-node ... Ignoring") runs several samplers per node into one gpu-<node>.csv. Slurm
# 22.05 lets the command line's --ntasks-per-node win; naming both makes every version agree.
ddp::monitor_start() {
    local -r out_dir="$1" interval="$2"
    DDP_MONITOR_PID=""
    if [ "${interval}" = 0 ]; then
        return 0
    fi
    mkdir -p "${out_dir}"
    local -a where=(--nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks="${SLURM_JOB_NUM_NODES:-1}")
    local -r placed="$(ddp::step_nodes sampler)"
    if [ -n "${placed}" ]; then  # with spares: one sampler on each training node
        local -a listed=()
        IFS=, read -r -a listed <<< "${placed}"
        where=(--nodes="${#listed[@]}" --ntasks="${#listed[@]}" --nodelist="${placed}")
    fi
    ddp::take_step_id
    srun --overlap "${where[@]}" --ntasks-per-node=1 --kill-on-bad-exit=0 \
        --output="${out_dir}/sampler-%N.log" \
        "${DDP_REPO}/slurm/gpu-sampler.sh" "${out_dir}" "${interval}" &
    DDP_MONITOR_PID=$!
    ddp::log "GPU sampler started (pid ${DDP_MONITOR_PID}): ${out_dir}/gpu-<node>.csv"
}

# srun ends a step on TERM after waiting up to KillWait + 2 s for its tasks ("Job step aborted: Waiting
# up to 7 seconds", KillWait=5 on the test cluster; slurm.conf(5) KillWait, default 30 s), and a lost
# node's never end: after a lost node the sampler is only told to stop (`ddp::monitor_stop later`),
# so that the next training step need not wait for it; bash reaps it.
#   ddp::monitor_stop [later]
ddp::monitor_stop() {
    [ -n "${DDP_MONITOR_PID:-}" ] || return 0
    kill -TERM "${DDP_MONITOR_PID}" 2>/dev/null || true
    if [ "${1:-}" = later ]; then
        ddp::log "GPU sampler stopping (pid ${DDP_MONITOR_PID}), not waited for: a lost node's sampler never ends"
    else
        wait "${DDP_MONITOR_PID}" 2>/dev/null || true
        ddp::log "GPU sampler stopped"
    fi
    DDP_MONITOR_PID=""
}

# Requeue after the trainer checkpointed on a stop signal (--signal=B:USR2@N, passed on by
# ddp::request_stop, or preemption). scontrol is not inside the image, so this runs in the batch script.
# Returns 0 when the job was requeued.
ddp::maybe_requeue() {
    local -r status="$1" run_dir="$2"
    local -r restarts="${SLURM_RESTART_COUNT:-0}" max="${DDP_MAX_REQUEUES:-3}"
    # 75 is the launcher's "every worker checkpointed on a stop signal", 76 "a node was named
    # bad"; anything else (a crash, a usage error, a kill) is not retried.
    if [ "${status}" -eq "${DDP_EXIT_BAD_NODE}" ]; then
        ddp::requeue_elsewhere "${run_dir}"
        return
    fi
    [ "${status}" -eq "${DDP_EXIT_REQUEUE}" ] || return 1
    if [ "${restarts}" -ge "${max}" ]; then
        ddp::log "stopped with a checkpoint, but already requeued ${restarts} times (DDP_MAX_REQUEUES=${max}): not requeuing"
        return 1
    fi
    local -r job="$(ddp::job_ref)"
    ddp::log "stopped with a checkpoint in ${run_dir}: requeuing job ${job} (restart $((restarts + 1)) of ${max})"
    scontrol requeue "${job}"
}

# The nodes of the job's partition, one per line.
ddp::partition_nodes() {
    local list
    list="$(sinfo -h -p "${SLURM_JOB_PARTITION:-}" -o %N 2>/dev/null | paste -sd, -)" || return 0
    [ -z "${list}" ] || scontrol show hostnames "${list}"
}

# Requeue without the nodes in the run directory's quarantine record, within DDP_MAX_REQUEUES.
# SLURM refuses ExcNodeList for a running job ("Job is no longer pending execution"), so the job
# is requeued held, given ExcNodeList while pending, then released (scontrol(1): requeuehold,
# update ExcNodeList=<nodes>, release; https://slurm.schedmd.com/scontrol.html). The requeue
# ends this script with SIGTERM, then SIGKILL after KillWait (slurm.conf(5)): the three calls
# ignore TERM, which their scontrol processes inherit, to finish well inside KillWait.
# Returns 0 when requeued.
ddp::requeue_elsewhere() {
    local -r run_dir="$1"
    local -r restarts="${SLURM_RESTART_COUNT:-0}" max="${DDP_MAX_REQUEUES:-3}"
    local excluded
    excluded="$(ddp::on_host ddp_contract.quarantine exclude "${run_dir}")"
    if [ "${restarts}" -ge "${max}" ]; then
        ddp::log "bad node(s) ${excluded} named, but already requeued ${restarts} times (DDP_MAX_REQUEUES=${max}): not requeuing"
        return 1
    fi
    local -a nodes=()
    mapfile -t nodes < <(ddp::partition_nodes)
    local short
    # sinfo said nothing (no partition): SLURM itself then decides whether the job can start.
    if [ "${#nodes[@]}" -gt 0 ] \
        && ! short="$(ddp::on_host ddp_contract.quarantine enough "${run_dir}" "${SLURM_JOB_NUM_NODES:-1}" "${nodes[@]}")"; then
        ddp::log "${short}"
        return 1
    fi
    local -r job="$(ddp::job_ref)"
    ddp::log "bad node(s) ${excluded}: requeuing job ${job} without them (restart $((restarts + 1)) of ${max}, exit ${DDP_EXIT_BAD_NODE})"
    (
        trap '' TERM
        scontrol requeuehold "${job}"
        scontrol update JobId="${job}" ExcNodeList="${excluded}"
        scontrol release "${job}"
    )
}

# The nodes excluded so far, and why, in the job output.
ddp::show_quarantine() {
    local line
    while IFS= read -r line; do
        ddp::log "${line}"
    done < <(ddp::on_host ddp_contract.quarantine show "${DDP_RUN_DIR}")
}

# The preflight: `ddp-launch doctor --json` on every node at once, one report per node
# (preflight/<job>/doctor-<node>.json); a node with a FAIL goes into the quarantine record. A check
# that fails on every node (the only node of a 1-node job included, except for GPU health: a GPU's
# fault is its node's) is the setup's: the job stops in one line with the fix, exit 2, and nothing
# is excluded or requeued (ddp_contract.quarantine, setup_problem, says why).
ddp::preflight() {
    if [ "${DDP_PREFLIGHT:-1}" = 0 ]; then
        ddp::log "preflight skipped (DDP_PREFLIGHT=0)"
        return 0
    fi
    local -r dir="${DDP_RUN_DIR}/preflight/${SLURM_JOB_ID:-local}"
    mkdir -p "${dir}"
    rm -f "${dir}"/doctor-*.json
    local -r started="${SECONDS}"
    # --ntasks as well: a step inherits the job's task count (SLURM_NTASKS), which would
    # override --ntasks-per-node and run two doctors into one node's file.
    # The workload's, for its checks: a script the containers cannot see fails here, on every node, in one line.
    local -a workload=("${DDP_WORKLOAD_FLAGS[@]}")
    [ -z "${DDP_DATA_DIR:-}" ] || workload+=(--data-dir "${DDP_DATA_DIR}")
    ddp::take_step_id
    srun --nodes="${SLURM_JOB_NUM_NODES:-1}" --ntasks="${SLURM_JOB_NUM_NODES:-1}" --ntasks-per-node=1 \
        --kill-on-bad-exit=0 --output="${dir}/doctor-%N.json" --error="${dir}/doctor-%N.err" \
        "${DDP_RUNTIME}" "${DDP_APPTAINER_ARGS[@]}" "${DDP_IMAGE}" \
        doctor --json --site "${DDP_SITE}" "${workload[@]}" || true
    ddp::log "preflight step: $((SECONDS - started)) s"
    local status=0 said
    said="$(ddp::on_host ddp_contract.quarantine add --by doctor --job "${SLURM_JOB_ID:-local}" \
        --restart "${SLURM_RESTART_COUNT:-0}" --nodes "${SLURM_JOB_NUM_NODES:-1}" \
        "${DDP_RUN_DIR}" "${dir}"/doctor-*.json)" || status=$?
    if [ "${status}" -eq "${DDP_EXIT_USAGE}" ]; then
        ddp::err "${said:-the preflight could not judge the doctor reports in ${dir} (see above)}"
    fi
    [ -z "${said}" ] || printf '%s\n' "${said}" >&2
    if [ "${status}" -eq 0 ]; then
        ddp::log "preflight: ddp-launch doctor passed on every node (${dir})"
    fi
    return "${status}"
}

# The fabric gate (src/ddp_train/gate/run.py). The built-in trainer runs it in its own ranks, on the
# training's process group before the first step (ddp-train --fabric-gate, which ddp::train passes): one
# container start, torch import and rendezvous per rank instead of two, every job start. A node it
# names ends the training step with 76 before anything is trained, and ddp::train_with_spares handles
# it as it would here (ddp::gate_named). A user's script gets the gate as a step of its own before the
# training, through ddp-launch (--module ddp_train.gate) like the training: same ranks and environment,
# our own module whatever the workload is (the training step's ddp-launch flags without the workload's).
#   ddp::gate MODE
ddp::gate() {
    local -r mode="$1"
    if [ "${DDP_FABRIC_GATE:-1}" = 0 ]; then
        ddp::log "fabric gate skipped (DDP_FABRIC_GATE=0)"
        return 0
    fi
    if ddp::gate_in_training; then
        ddp::log "fabric gate: in the training step, on the trainer's process group before its first step (ddp-train --fabric-gate)"
        return 0
    fi
    # shellcheck disable=SC2086 # the launchers' reports' glob: the gate's step starts without an earlier step's
    rm -f "${DDP_RUN_DIR}/gate.json" "${DDP_RUN_DIR}/gate.txt" "${DDP_RUN_DIR}"/${DDP_LAUNCHER_CRASH_REPORTS}
    local -r started="${SECONDS}"
    local status=0
    ddp::launch_step "${mode}" gate --module ddp_train.gate \
        -- --run-dir "${DDP_RUN_DIR}" --site "${DDP_SITE}" --backend auto || status=$?
    ddp::log "fabric gate step (launch included): $((SECONDS - started)) s"
    if [ "${status}" -eq "${DDP_EXIT_BAD_NODE}" ]; then
        ddp::gate_named || true
    elif [ "${status}" -ne 0 ]; then
        ddp::log "fabric gate failed (exit ${status}) without naming a node: see ${DDP_RUN_DIR}/gate.txt and the logs"
    fi
    return "${status}"
}

# Whether the training step runs the gate: the built-in trainer's, unless DDP_FABRIC_GATE=0.
ddp::gate_in_training() {
    [ "${DDP_WORKLOAD}" = builtin ] && [ "${DDP_FABRIC_GATE:-1}" != 0 ]
}

# The nodes the gate's report names (<run-dir>/gate.json) into the quarantine record; the status of
# ddp_contract.quarantine add: 76 when a node is new to the record.
ddp::gate_named() {
    ddp::on_host ddp_contract.quarantine add --by gate --job "${SLURM_JOB_ID:-local}" \
        --restart "${SLURM_RESTART_COUNT:-0}" "${DDP_RUN_DIR}" "${DDP_RUN_DIR}/gate.json" >&2
}

# One srun step of ddp-launch in the image: the training, or the fabric gate before it.
#   ddp::launch_step MODE NAME [LAUNCH_ARGS...] -- WORKER_ARGS...
# MODE node: torchrun per node; per-rank logs from torchrun in $DDP_RUN_DIR/logs/<job>/<node>
# (the gate's in logs/gate-<job>/). MODE task: one srun task per GPU (ddp-launch --mode
# slurm-task), one log file per rank from srun (the gate's in logs/gate/).
ddp::launch_step() {
    local -r mode="$1" name="$2"
    shift 2
    local -a srun_args=() launch_args=(--site "${DDP_SITE}") extra_args=()
    while [ "$#" -gt 0 ] && [ "$1" != -- ]; do
        extra_args+=("$1")
        shift
    done
    shift  # --
    if [ -n "${DDP_CPU_WORKERS:-}" ]; then
        launch_args+=(--cpu-workers "${DDP_CPU_WORKERS}")
    fi
    ddp::placement srun_args "$(ddp::step_nodes "${name}")"  # with spares: part of the allocation

    local log_dir="${DDP_RUN_DIR}/logs"
    local job_logs="${SLURM_JOB_ID:-local}"
    if [ "${name}" != train ]; then
        job_logs="${name}-${job_logs}"
    fi
    case "${mode}" in
        node) launch_args+=(--log-dir "${log_dir}/${job_logs}") ;;
        task)
            if [ "${name}" != train ]; then
                log_dir="${log_dir}/${name}"
            fi
            srun_args+=(--output="${log_dir}/%j-%N-rank%t.out")
            launch_args+=(--mode slurm-task)
            ;;
        *) ddp::err "ddp::launch_step: mode '${mode}' is not node or task" ;;
    esac
    mkdir -p "${log_dir}"

    # Every task ends with the same code (a stop is agreed by all ranks), but not at the
    # same instant: with --kill-on-bad-exit=1 srun would kill the others as soon as the
    # first exits 75 or 2, and report their death (143) instead of the code. --wait
    # gives them DDP_STEP_WAIT seconds to end on their own after the first task ends
    # (srun(1): -K overrides -W), which still bounds a hang behind a crashed node.
    local -a step=(srun --kill-on-bad-exit=0 --wait="${DDP_STEP_WAIT:-30}" "${DDP_SITE_SRUN_ARGS[@]}" "${srun_args[@]}"
        "${DDP_RUNTIME}" "${DDP_APPTAINER_ARGS[@]}" "${DDP_IMAGE}"
        "${launch_args[@]}" "${DDP_LAUNCH_WORDS[@]}" "${extra_args[@]}"
        -- "$@")
    # The site's --network also in the step's environment: srun reads SLURM_NETWORK as --network (srun(1),
    # INPUT ENVIRONMENT VARIABLES: "Same as --network"), so the two agree, and the step's tasks inherit it,
    # where ddp-launch reads it: HPE's FI_CXI_RDZV_PROTO=alt_read only in a step with
    # --network=disable_rdzv_get (fabric defaults, rdzv_get_disabled; libfabric's fi_cxi(7)).
    if [ -n "${DDP_SITE_NETWORK}" ]; then
        local -x SLURM_NETWORK="${DDP_SITE_NETWORK}"
    fi
    local status=0
    ddp::take_step_id
    if [ "${mode}" = task ]; then
        ddp::log "${name}: per-rank logs: ${log_dir}/${SLURM_JOB_ID:-}-<node>-rank<N>.out; rank 0's follows"
        ddp::run_following "${log_dir}/${SLURM_JOB_ID:-}-$(ddp::first_node "${name}")-rank0.out" "${step[@]}" || status=$?
    else
        "${step[@]}" &
        ddp::wait_for "$!" || status=$?
        ddp::log "${name}: per-rank logs: ${log_dir}/${job_logs}/<node>/<run>/attempt_<N>/<local rank>/"
    fi
    return "${status}"
}

# Run a step and copy FILE into the job's output while it runs. In task mode srun writes each
# rank's output to its own file (--output with %t), so the job's .out would show nothing until
# the step ended; node mode's torchrun tees to the console instead. GNU tail -F follows the
# file from its creation (or from its current end: a requeued job's earlier lines are not
# repeated) and --pid ends it once the step has exited and the file is read to its end
# (coreutils tail(1), --pid).
#   ddp::run_following FILE COMMAND...
ddp::run_following() {
    local -r file="$1"
    shift
    local from=+1
    [ ! -e "${file}" ] || from=0
    "$@" &
    local -r step_pid=$!
    tail -n "${from}" -F --pid="${step_pid}" -- "${file}" 2>/dev/null &
    local -r tail_pid=$!
    local status=0
    ddp::wait_for "${step_pid}" || status=$?
    wait "${tail_pid}" || true
    return "${status}"
}

# Wait for a background process and return its exit status. bash runs a trap only once the
# foreground command has ended, so a step runs in the background and this script waits for it:
# a trapped signal then interrupts `wait`, which returns above 128 while the process still
# runs (bash(1), "wait" and "SIGNALS"), and the wait goes on.
#   ddp::wait_for PID
ddp::wait_for() {
    local -r pid="$1"
    local status
    while true; do
        status=0
        wait "${pid}" || status=$?
        if [ "${status}" -gt 128 ] && kill -0 "${pid}" 2>/dev/null; then
            continue
        fi
        return "${status}"
    done
}

# The time-limit warning. The scripts ask for --signal=B:USR2@120, which SLURM sends to this
# shell alone (sbatch(1), --signal: "B: signal only the batch shell"). Sent to every process of
# the step, it would also reach the squashfuse_ll through which unprivileged Apptainer serves
# the image: that dies, and the workers with SIGBUS before any checkpoint (apptainer#3197 shows
# the same for SIGINT). The trap asks the training step to stop through a file in the run dir:
# rank 0 reads it, the trainer checkpoints and exits 75 as on the signal (src/ddp_train/safety/signals.py).
#   ddp::request_stop SIGNAL      (USR2, USR1)
ddp::request_stop() {
    local -r request="${DDP_RUN_DIR}/${DDP_STOP_REQUEST_FILE}"
    # Written aside and renamed: the trainer never reads half a request.
    if printf 'SIG%s\n' "$1" > "${request}.tmp" && mv -f "${request}.tmp" "${request}"; then
        ddp::log "SIG$1 reached the batch script: asked the training step to checkpoint and stop (${request})"
    else
        ddp::log "SIG$1 reached the batch script, but ${request} could not be written: the job runs on to its time limit"
    fi
}

# The training step: the image's runscript (ddp-launch), the workload's arguments last. The built-in trainer
# gets its data and run dirs as flags; a user's workload exactly its arguments, and the dirs as variables
# (DDP_DATA_DIR, DDP_RUN_DIR, exported).
#   ddp::train MODE
ddp::train() {
    local -r mode="$1"
    if [ "${DDP_WORKLOAD}" = builtin ]; then
        local -a gate=()
        ! ddp::gate_in_training || gate=(--fabric-gate --site "${DDP_SITE}")
        ddp::launch_step "${mode}" train -- --data-dir "${DDP_DATA_DIR}" --run-dir "${DDP_RUN_DIR}" \
            "${gate[@]}" "${DDP_TRAIN_WORDS[@]}" "${DDP_WORKLOAD_ARGS[@]}"
    else
        ddp::launch_step "${mode}" train "${DDP_WORKLOAD_FLAGS[@]}" -- "${DDP_TRAIN_WORDS[@]}" "${DDP_WORKLOAD_ARGS[@]}"
    fi
}

# The node of rank 0, whose log a task-mode step follows: the step's first node. A step on the whole
# allocation starts on the job's first node, where sbatch runs the batch script ("Slurm runs a single
# copy of the batch script on the first node in the set of allocated nodes", sbatch(1)) and names it
# in SLURMD_NODENAME ("Name of the node running the job script", sbatch(1), OUTPUT ENVIRONMENT
# VARIABLES; sbatch --batch=<features>, which no job script here uses, could pick another); srun's
# block distribution puts task 0 there. A step on part of it (spares, ddp::placement) starts on its
# own first node, which is not the batch script's when the preflight named that one. Outside a batch
# job: this host.
#   ddp::first_node [STEP_NAME]
ddp::first_node() {
    local -r placed="$(ddp::step_nodes "${1:-}")"
    if [ -n "${placed}" ]; then
        printf '%s\n' "${placed%%,*}"
    else
        printf '%s\n' "${SLURMD_NODENAME:-$(hostname -s)}"
    fi
}

# Spare nodes (DDP_SPARE_NODES=S). The allocation is N + S nodes; the training runs on N of them,
# and a node the preflight, the fabric gate or a roll call names is replaced inside the allocation:
# no requeue, no new wait in the queue. Which nodes train is decided by ddp_contract.spares from the
# run dir's quarantine record: the first N healthy nodes in the allocation's order, so the survivors
# keep their places and the next healthy spare takes the bad node's. The preflight runs on every healthy
# node of the allocation, spares included; the built-in trainer's gate runs on the nodes that train, so a
# spare is gated in the step it first trains in, before its first step (a script's gate step, on every
# healthy node). A spare swapped in mid-run has passed the preflight, and passes the gate before it trains.
#
# A node that fails mid-job: by default slurmctld ends the whole job once it marks the node DOWN
# (SlurmdTimeout, slurm.conf(5), default 300 s), as NODE_FAIL. Every job script asks for
# `#SBATCH --no-kill`: "the job allocation will not be revoked so the user may launch new job
# steps on the remaining nodes" (sbatch(1), --no-kill; on the test cluster slurmctld logs "Removing
# failed node node2 from JobId=..." and the job runs on). Neither `scontrol show job` nor its --json
# shows the flag (SLURM 26.05), so the library cannot check it: a script of one's own needs the line.
DDP_ALLOCATION=()     # the allocation's nodes in SLURM's order (scontrol show hostnames), with spares
DDP_TRAIN_NODELIST="" # the training step's nodes, comma-separated; empty: the whole allocation
DDP_GATE_NODELIST=""  # the fabric gate's: every healthy node; empty: the whole allocation
DDP_OVERLAP_STEP=0    # 1 once a node was lost mid-run (ddp::placement says why)
DDP_FAULT_AT=""       # when the preflight or the gate first named a node, in seconds since the epoch
DDP_PLACEMENT_SAID="" # the last placement line said

ddp::now() {
    date +%s.%N
}

# DDP_SPARE_NODES and DDP_TRAIN_NODES against the job's node count, first thing in the job: an allocation
# without room for the spares beside the nodes the script trains on (sbatch --nodes=N+S forgotten) stops
# here in one line, exit 2 (ddp_contract.EXIT_USAGE), before any step or file (ddp_contract.spares, check).
ddp::check_spares() {
    local said status=0
    said="$(ddp::on_host ddp_contract.spares check "${SLURM_JOB_NUM_NODES:-1}" "${DDP_SPARE_NODES:-0}" \
        "${DDP_TRAIN_NODES:-}" --job "${SLURM_JOB_ID:-local}")" || status=$?
    [ "${status}" -eq 0 ] || ddp::err "${said:-python3 -m ddp_contract.spares check failed (exit ${status}; see above)}"
    export DDP_SPARE_NODES="$((10#${DDP_SPARE_NODES:-0}))"
}

# The allocation read when there are spares (checked by ddp::check_spares), before any step.
ddp::spares_setup() {
    local -r allocated="${SLURM_JOB_NUM_NODES:-1}"
    [ "${DDP_SPARE_NODES}" -gt 0 ] || return 0
    mapfile -t DDP_ALLOCATION < <(scontrol show hostnames "${SLURM_JOB_NODELIST:-}")
    if [ "${#DDP_ALLOCATION[@]}" -ne "${allocated}" ]; then
        ddp::err "scontrol show hostnames ${SLURM_JOB_NODELIST:-} gave ${#DDP_ALLOCATION[@]} node(s), not the job's ${allocated}: cannot place spares"
    fi
    ddp::log "spares: ${DDP_SPARE_NODES} of the job's ${allocated} nodes wait as spares, the training runs on $((allocated - DDP_SPARE_NODES)) (DDP_SPARE_NODES=${DDP_SPARE_NODES}, DDP_TRAIN_NODES=${DDP_TRAIN_NODES:-?})"
}

# Which nodes train and which gate, from the quarantine record (python3 -m ddp_contract.spares place,
# its options: --previous, --named-at, --step-ended-at, --roll-call). Sets DDP_TRAIN_NODELIST and
# DDP_GATE_NODELIST, exports DDP_RECOVERY for the training step when a spare replaces a training node
# (the trainer records the recovery from it), and says the placement in one line. Returns 1 with one
# line when too few healthy nodes are left.
ddp::place() {
    local out status=0 line recovery=""
    out="$(ddp::on_host ddp_contract.spares place "$@" "${DDP_RUN_DIR}" "${DDP_SPARE_NODES}" \
        "${DDP_ALLOCATION[@]}")" || status=$?
    if [ "${status}" -ne 0 ]; then
        ddp::log "spares: ${out:-python3 -m ddp_contract.spares failed (exit ${status}; see above)}"
        [ "${status}" -eq 1 ] || exit "${status}"
        return 1
    fi
    while IFS= read -r line; do
        case "${line}" in
            train=*) DDP_TRAIN_NODELIST="${line#train=}" ;;
            healthy=*) DDP_GATE_NODELIST="${line#healthy=}" ;;
            recovery=*) recovery="${line#recovery=}" ;;
            say=*)  # said once, and again only when it changes (after the preflight, after the gate)
                [ "${line}" = "${DDP_PLACEMENT_SAID}" ] || ddp::log "spares: ${line#say=}"
                DDP_PLACEMENT_SAID="${line}"
                ;;
        esac
    done <<< "${out}"
    # Every node healthy: the gate runs on the whole allocation, as without spares.
    [ "${DDP_GATE_NODELIST}" != "$(IFS=,; printf '%s' "${DDP_ALLOCATION[*]}")" ] || DDP_GATE_NODELIST=""
    if [ -n "${recovery}" ]; then
        export DDP_RECOVERY="${recovery}"
    else
        unset DDP_RECOVERY
    fi
}

# Before the training, with spares: the nodes the preflight or the gate named (STATUS 76) are left
# out and spares take their places; 76 again when too few healthy nodes are left, which requeues the
# job without them as without spares. Any other STATUS is returned as it is.
#   ddp::place_before_training STATUS
ddp::place_before_training() {
    local -r status="$1"
    if [ "${DDP_SPARE_NODES:-0}" = 0 ] || { [ "${status}" -ne 0 ] && [ "${status}" -ne "${DDP_EXIT_BAD_NODE}" ]; }; then
        return "${status}"
    fi
    if [ "${status}" -eq "${DDP_EXIT_BAD_NODE}" ] && [ -z "${DDP_FAULT_AT}" ]; then
        DDP_FAULT_AT="$(ddp::now)"
    fi
    local -a named=()
    [ -z "${DDP_FAULT_AT}" ] || named=(--named-at "${DDP_FAULT_AT}")
    if ! ddp::place "${named[@]}"; then
        ddp::log "spares: none left for the bad node(s): falling back to a requeue without them (exit ${DDP_EXIT_BAD_NODE})"
        return "${DDP_EXIT_BAD_NODE}"
    fi
}

# srun's options that put a step on CSV's nodes (comma-separated; none: the whole allocation),
# appended to ARRAY_NAME. --ntasks
# too: a step inherits the job's SLURM_NTASKS, which would win over --ntasks-per-node ("the --ntasks
# option will take precedence", srun(1)). SLURM runs a step's tasks on its nodes in the allocation's
# order whatever order --nodelist gives ("the node names will be sorted by Slurm", srun(1); on the
# test cluster --nodelist=node4,node3,node1 ran task 0 on node1, SLURM_STEP_NODELIST=node[1,3-4]),
# which ddp::first_node and ddp-launch's head (the step's first node) rely on.
# After a node was lost, the failed step still holds its resources on the survivors until slurmctld
# marks the lost node DOWN (SlurmdTimeout) and removes it from the job: a new step there waits
# ("srun: Step created" 22 s late on the test cluster, SlurmdTimeout=60). --overlap lets it share
# them ("allows steps to share all resources (CPUs, memory, and GRES) with all other steps",
# srun(1)); the failed step's processes on the survivors have ended by then.
#   ddp::placement ARRAY_NAME CSV
ddp::placement() {
    local -n into="$1"
    local -r csv="$2"
    [ -n "${csv}" ] || return 0
    local -a listed=()
    IFS=, read -r -a listed <<< "${csv}"
    local -r count="${#listed[@]}"
    local -r per_node="${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-${SLURM_JOB_NUM_NODES:-1}} / ${SLURM_JOB_NUM_NODES:-1}))}"
    into+=(--nodes="${count}" --ntasks="$((count * per_node))" --nodelist="${csv}")
    [ "${DDP_OVERLAP_STEP}" = 0 ] || into+=(--overlap)
}

# The nodes a step runs on: the training's and the gate's may be part of the allocation (spares).
#   ddp::step_nodes NAME      (train | gate | sampler)
ddp::step_nodes() {
    case "$1" in
        train | sampler) printf '%s\n' "${DDP_TRAIN_NODELIST}" ;;
        gate) printf '%s\n' "${DDP_GATE_NODELIST}" ;;
        *) printf '\n' ;;
    esac
}

# Whether NODE's slurmd still answers, by a step of `true` on it alone, within DDP_NODE_PROBE_S
# (default 20). A lost node's slurmd is gone with it (killed, or off the network): srun cannot launch
# there ("Task launch ... failed on node ...: Communication connection failure"), or, once slurmctld
# has marked the node DOWN and --no-kill removed it from the job, cannot create the step. The
# survivors' part of the failed step may still hold its resources: --overlap, as ddp::placement.
#   ddp::slurmd_answers NODE
ddp::slurmd_answers() {
    local -r node="$1"
    ddp::take_step_id
    timeout --kill-after=5 "${DDP_NODE_PROBE_S:-20}" \
        srun --overlap --nodes=1 --ntasks=1 --nodelist="${node}" --time=1 --quiet true >/dev/null 2>&1
}

# A training step that failed without a roll call's report while slurmctld stopped hearing from one of
# its nodes: slurmctld kills the whole step once a node misses its pings (SlurmdTimeout, slurm.conf(5)),
# which can come before the collective timeout and the roll call have named it. The training nodes that
# sinfo marks as not responding (a state suffixed "*") or down (sinfo(1), NODE STATE CODES) are written
# as the roll call writes them (<run-dir>/roll-call.json), for ddp::replace_lost_node, which asks each
# one's slurmd itself before it takes the node for lost.
#   ddp::report_unheard_nodes
ddp::report_unheard_nodes() {
    local node state lost=""
    while read -r node state; do
        case "${state}" in
            *"*" | down*) lost+="${lost:+, }{\"node\": \"${node}\", \"ranks\": [], \"why\": \"lost mid-run: slurmctld stopped hearing from it (sinfo: ${state})\"}" ;;
        esac
    done < <(sinfo --noheader --Node --nodes="${DDP_TRAIN_NODELIST:-${SLURM_JOB_NODELIST:-}}" --format="%N %t" \
        2>/dev/null | sort -u)
    [ -n "${lost}" ] || return 0
    local -r now="$(ddp::now)" cause="slurmctld stopped hearing from the node (sinfo: not responding or down)"
    printf '{"lost": [%s], "cause": "%s", "failed_at": %s, "named_at": %s, "message": "%s"}\n' \
        "${lost}" "${cause}" "${now}" "${now}" "${cause}" > "${DDP_RUN_DIR}/${DDP_ROLL_CALL_REPORT}"
    ddp::log "the training step failed with no roll call, and ${cause}: ${DDP_RUN_DIR}/${DDP_ROLL_CALL_REPORT}"
}

# After a failed training step whose roll call named the lost node(s) (<run-dir>/roll-call.json,
# src/ddp_train/safety/peers.py): they go into the quarantine record, and a spare takes each one's place
# (return 0: train again). A lost node is a bad node: with no spare (DDP_SPARE_NODES=0, or all used up)
# the job is requeued without it from the last checkpoint, as for a node the preflight or the gate names
# (return 76, ddp::maybe_requeue, within DDP_MAX_REQUEUES). The scripts' --no-kill keeps slurmctld from
# ending the job as NODE_FAIL (and requeueing it onto the same node where it is not marked DOWN yet), so
# this is where a lost node's requeue happens; its late kills are harmless (ddp::skip_used_step_ids).
# A node is lost only if its slurmd no longer answers (ddp::slurmd_answers): every rank of a live node
# also falls silent when its launcher is killed (the OOM killer: its workers die with it), in task mode
# when all its tasks are, or when its launcher stopped on a usage error. So is one whose own ddp-launch
# wrote that it ended the step (launcher-crash-<node>.json). Such a node is kept, and the step's
# failure is the job's: its own status (137 for a killed launcher, 2 for a usage error), never a
# requeue. The seconds from the fault to training again are the trainer's to say (DDP_RECOVERY).
#   ddp::replace_lost_node STEP_ENDED_AT STEP_STATUS
ddp::replace_lost_node() {
    local -r ended_at="$1" step_status="$2" report="${DDP_RUN_DIR}/${DDP_ROLL_CALL_REPORT}"
    local status=0 node
    local -a up=()
    while IFS= read -r node; do
        if [ -n "${node}" ] && ddp::slurmd_answers "${node}"; then
            up+=(--up "${node}")
        fi
    done < <(ddp::on_host ddp_contract.quarantine lost "${report}")
    ddp::on_host ddp_contract.quarantine add --by roll-call --job "${SLURM_JOB_ID:-local}" \
        --restart "${SLURM_RESTART_COUNT:-0}" "${up[@]}" "${DDP_RUN_DIR}" "${report}" >&2 || status=$?
    if [ "${status}" -ne "${DDP_EXIT_BAD_NODE}" ]; then  # 76: a node new to the record
        # A status that would requeue (75, 76) is not this step's own to give: a crash then.
        status="${step_status}"
        [ "${status}" -ne "${DDP_EXIT_REQUEUE}" ] && [ "${status}" -ne "${DDP_EXIT_BAD_NODE}" ] || status=1
        ddp::log "the failed step's roll call named no node to exclude (${report}): exit ${status}"
        return "${status}"
    fi
    if [ "${DDP_SPARE_NODES:-0}" = 0 ]; then
        ddp::log "a node was lost mid-run and the job has no spare node (DDP_SPARE_NODES=0): requeuing without it, to resume from the last checkpoint (exit ${DDP_EXIT_BAD_NODE})"
        return "${DDP_EXIT_BAD_NODE}"
    fi
    if ! ddp::place --previous "${DDP_TRAIN_NODELIST}" --step-ended-at "${ended_at}" --roll-call "${report}"; then
        ddp::log "spares: none left for the lost node: falling back to a requeue without it (exit ${DDP_EXIT_BAD_NODE})"
        return "${DDP_EXIT_BAD_NODE}"
    fi
    if [ -z "${DDP_RECOVERY:-}" ]; then  # the node named is none of the training's: nothing to replace
        ddp::log "spares: the roll call named no training node (${report}): exit 1"
        return 1
    fi
    DDP_OVERLAP_STEP=1
}

# The training step, and after a node lost mid-run the next one on the survivors and a spare, from
# the last checkpoint (DDP_RESUME=1 for it), while spares are left; after a node its gate named (the
# built-in trainer's, before anything trained), the next one on the survivors and a spare as after the
# preflight. The sampler runs on the training's nodes.
#   ddp::train_with_spares MODE
ddp::train_with_spares() {
    local status ended_at
    while true; do
        status=0
        # shellcheck disable=SC2086 # the crash reports' glob
        rm -f -- "${DDP_RUN_DIR}/${DDP_ROLL_CALL_REPORT}" "${DDP_RUN_DIR}"/${DDP_LAUNCHER_CRASH_REPORTS}
        # A gate report after the step is this step's (ddp-train --fabric-gate).
        ! ddp::gate_in_training || rm -f -- "${DDP_RUN_DIR}/gate.json" "${DDP_RUN_DIR}/gate.txt"
        ddp::monitor_start "${DDP_RUN_DIR}/gpu" "${DDP_MONITOR_INTERVAL:-5}"
        ddp::train "$@" || status=$?
        ended_at="$(ddp::now)"
        unset DDP_RECOVERY
        # The trainer's gate named a node (exit 76 from the trainer means only that; a node lost mid-run is
        # the roll call's, exit 1) before anything was trained: as the gate's own step before the training.
        if [ "${status}" -eq "${DDP_EXIT_BAD_NODE}" ] && ddp::gate_in_training \
            && [ -e "${DDP_RUN_DIR}/gate.json" ]; then
            ddp::monitor_stop
            status=0
            ddp::gate_named || status=$?
            if [ "${status}" -ne "${DDP_EXIT_BAD_NODE}" ]; then  # nothing new to leave out: a crash, not a loop
                ddp::log "the training's fabric gate exited ${DDP_EXIT_BAD_NODE} and its report named no node new to the quarantine record (${DDP_RUN_DIR}/gate.json): exit 1"
                return 1
            fi
            ddp::place_before_training "${status}" || return "$?"
            continue
        fi
        if [ "${status}" -ne 0 ] && [ "${status}" -ne "${DDP_EXIT_REQUEUE}" ] \
            && [ ! -e "${DDP_RUN_DIR}/${DDP_ROLL_CALL_REPORT}" ]; then
            ddp::report_unheard_nodes
        fi
        if [ "${status}" -ne 0 ] && ddp::gate_in_training \
            && grep -q '"ok": false' "${DDP_RUN_DIR}/gate.json" 2>/dev/null; then
            ddp::log "fabric gate failed (exit ${status}) without naming a node: see ${DDP_RUN_DIR}/gate.txt and the logs"
        fi
        # A crash on a live node (a killed worker) makes no report: no spare for that.
        if [ "${status}" -eq 0 ] || [ "${status}" -eq "${DDP_EXIT_REQUEUE}" ] \
            || [ ! -e "${DDP_RUN_DIR}/${DDP_ROLL_CALL_REPORT}" ]; then
            ddp::monitor_stop
            return "${status}"
        fi
        ddp::monitor_stop later
        ddp::replace_lost_node "${ended_at}" "${status}" || return "$?"
        export DDP_RESUME=1
    done
}

# The whole job: checks, the preflight and the fabric gate, sampler, training step, sampler
# stopped, spares in bad nodes' places (DDP_SPARE_NODES), requeue (after a stop, or without a bad
# node) or exit.
#   ddp::run_job MODE WORKLOAD_ARGS...     (MODE: node | task, see ddp::train)
ddp::run_job() {
    local -r mode="$1"
    shift
    ddp::check_spares
    ddp::split_words DDP_LAUNCH_WORDS DDP_LAUNCH_ARGS
    ddp::read_workload "$@"
    ddp::workload_words
    ddp::expand_run_dir
    if [ "${DDP_WORKLOAD}" = builtin ]; then
        ddp::absolute_dir_setting DDP_DATA_DIR
    fi
    ddp::absolute_dir_setting DDP_RUN_DIR
    ddp::workload_dirs
    ddp::require_runtime
    ddp::require_image "${DDP_IMAGE}"
    if [ "${DDP_WORKLOAD}" = builtin ]; then
        ddp::require_data "${DDP_DATA_DIR}"
    fi
    ddp::require_free_run_dir "${DDP_RUN_DIR}"
    if [ "${DDP_WORKLOAD}" = builtin ]; then  # a script of the user's resumes by its own rules
        ddp::require_resumable "${DDP_RUN_DIR}" "${DDP_WORKLOAD_ARGS[@]}"
    fi
    mkdir -p "${DDP_RUN_DIR}"
    # What every workload is told (ddp_contract.workload): the stop request's file, and whether this run
    # continues an earlier one of its run dir (a requeue; a spare's replacement sets it too).
    export DDP_STOP_REQUEST="${DDP_RUN_DIR}/${DDP_STOP_REQUEST_FILE}"
    if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] 2>/dev/null; then
        export DDP_RESUME=1
    else
        export DDP_RESUME=0
    fi
    local -a dirs=("${DDP_RUN_DIR}")
    [ -z "${DDP_DATA_DIR:-}" ] || dirs=("${DDP_DATA_DIR}" "${dirs[@]}")
    [ -z "${DDP_VENV:-}" ] || dirs+=("${DDP_VENV}")
    ddp::export_binds "${DDP_SITE}" "${dirs[@]}"
    ddp::print_job
    ddp::spares_setup
    DDP_APPTAINER_ARGS=(run)
    if [ "${DDP_GPU:-1}" = 1 ]; then
        ddp::gpu_flag "${DDP_SITE}"
        DDP_APPTAINER_ARGS+=("${DDP_GPU_FLAG}")
    fi
    ddp::site_srun_args "${DDP_SITE}"
    ddp::show_quarantine
    ddp::skip_used_step_ids
    # A request left by an earlier run of this job (it crashed before acting on it) is void.
    rm -f -- "${DDP_RUN_DIR}/${DDP_STOP_REQUEST_FILE}"
    trap 'ddp::request_stop USR2' USR2
    trap 'ddp::request_stop USR1' USR1
    local status=0
    ddp::preflight || status=$?
    if ddp::place_before_training "${status}"; then status=0; else status=$?; fi
    if [ "${status}" -eq 0 ]; then
        ddp::gate "${mode}" || status=$?
        if ddp::place_before_training "${status}"; then status=0; else status=$?; fi
    fi
    if [ "${status}" -eq 0 ]; then
        ddp::train_with_spares "${mode}" || status=$?
    fi
    if ddp::maybe_requeue "${status}" "${DDP_RUN_DIR}"; then
        # 76 stays this run's code (sacct shows why it ended); a checkpointed stop ends well (0).
        [ "${status}" -eq "${DDP_EXIT_BAD_NODE}" ] && exit "${status}"
        exit 0
    fi
    if [ "${status}" -eq "${DDP_EXIT_BAD_NODE}" ]; then
        ddp::log "not requeued: bad node(s) named above (exit ${status}); the run dir keeps the checkpoint and the quarantine record"
    elif [ "${status}" -ne 0 ]; then
        ddp::log "job failed with exit status ${status}$(ddp::exit_meaning "${status}"); per-rank logs are in ${DDP_RUN_DIR}/logs"
    fi
    exit "${status}"
}

# What an exit status above 128 says: srun's code for a task killed by signal N is 128 + N (the
# status a shell gives a process killed by a signal, bash(1), EXIT STATUS). Printed after the status,
# with the cause and where to read more (docs/troubleshooting.md); nothing for the others.
#   ddp::exit_meaning STATUS
ddp::exit_meaning() {
    case "$1" in
        135) printf ' (128 + SIGBUS: the image went away under the tasks: unprivileged Apptainer serves it through a squashfuse_ll process in the step, which a signal to every process of the step ends, the time limit'"'"'s TERM or scancel --signal without --batch; export APPTAINER_UNSQUASH=1 before sbatch where that happens; docs/troubleshooting.md, "Exit 135 or 137")' ;;
        137) printf ' (128 + SIGKILL: a task was killed: srun ends the tasks still running DDP_STEP_WAIT=%s s after the first one ended, a hung rank among them, or the OOM killer or a kill -9 took a launcher on a live node; see the lines above and docs/troubleshooting.md, "Exit 135 or 137")' "${DDP_STEP_WAIT:-30}" ;;
    esac
}
