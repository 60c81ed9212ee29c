# Shared setup for the bats tests: bats-assert, the repository root, and stubs of
# srun, sbatch, scontrol, sinfo, apptainer, singularity, nvidia-smi and the host launcher helper on PATH.
# Every stub appends "name argv..." to $CALLS and rejects options it does not know.

_common_setup() {
    load '/usr/lib/bats/bats-support/load'
    load '/usr/lib/bats/bats-assert/load'
    REPO="$(cd "${BATS_TEST_DIRNAME}/../.." && pwd)"
    STUBS="${BATS_TEST_TMPDIR}/bin"
    CALLS="${BATS_TEST_TMPDIR}/calls.log"
    STEP_ARGV="${BATS_TEST_TMPDIR}/step.argv"
    STEP_TASKS="${BATS_TEST_TMPDIR}/step-tasks.log"
    export REPO STUBS CALLS STEP_ARGV STEP_TASKS
    mkdir -p "${STUBS}"
    : > "${CALLS}"
    _write_stubs
    export PATH="${STUBS}:${PATH}"
}

_stub() {
    local -r name="$1" body="$2"
    printf '#!/usr/bin/env bash\nset -euo pipefail\nprintf "%%s\\n" "%s $*" >> "%s"\n%s\n' \
        "${name}" "${CALLS}" "${body}" > "${STUBS}/${name}"
    chmod +x "${STUBS}/${name}"
}

_write_stubs() {
    # srun: known options only, then the command; it records the command line and
    # the variables the job scripts export, and exits with $SRUN_STATUS (default 0).
    _stub srun '
nodes="${SLURM_JOB_NUM_NODES:-1}" ntasks="" per_node="" nodelist=""
for arg in "$@"; do
    case "${arg}" in
        --overlap|--kill-on-bad-exit=*|--wait=*|--error=*|--network=*) ;;
        --nodelist=*) nodelist="${arg#--nodelist=}" ;;
        --nodes=*) nodes="${arg#--nodes=}" ;;
        --ntasks=*) ntasks="${arg#--ntasks=}" ;;
        --ntasks-per-node=*) per_node="${arg#--ntasks-per-node=}" ;;
        --output=*) output="${arg#--output=}" ;;
        -*) echo "srun stub: unknown option ${arg}" >&2; exit 2 ;;
        *) break ;;
    esac
done
# How many tasks the step gets, by the rules of srun(1): SLURM_NTASKS, which a step inherits from its
# batch job, is "Same as -n, --ntasks" (INPUT ENVIRONMENT VARIABLES), and "the --ntasks option will
# take precedence and the --ntasks-per-node will be treated as a maximum" (--ntasks-per-node).
# One line per step in $STEP_TASKS: the task count, then the program the step runs.
ntasks="${ntasks:-${SLURM_NTASKS:-$((nodes * ${per_node:-1}))}}"
printf "%s %s\n" "${ntasks}" "${arg}" >> "'"${STEP_TASKS}"'"
# SLURM numbers the steps of a job 0, 1, 2... in the order it creates them, and a step it cannot create
# takes no id ("srun: error: Unable to create step"); $SRUN_REFUSE_STEPS such refusals come first.
exec 9>>"'"${BATS_TEST_TMPDIR}"'/step-ids.lock"
flock 9
refused="$(cat "'"${BATS_TEST_TMPDIR}"'/refused" 2>/dev/null || echo 0)"
if [ "${refused}" -lt "${SRUN_REFUSE_STEPS:-0}" ]; then
    echo "$((refused + 1))" > "'"${BATS_TEST_TMPDIR}"'/refused"
    echo "srun: error: Unable to create step for job ${SLURM_JOB_ID}: Job/step already completing or completed" >&2
    exit 1
fi
SLURM_STEP_ID="$(cat "'"${BATS_TEST_TMPDIR}"'/next-step-id" 2>/dev/null || echo 0)"
echo "$((SLURM_STEP_ID + 1))" > "'"${BATS_TEST_TMPDIR}"'/next-step-id"
flock -u 9
export SLURM_STEP_ID
case "$*" in *" printenv SLURM_STEP_ID") printf "%s\n" "${SLURM_STEP_ID}"; exit 0 ;; esac
# A training step takes a while; the sampler step beside it must get to record itself.
# Its argv is also kept one word per line, where word boundaries show.
case " $* " in *" apptainer "* | *" singularity "*) sleep 0.5; printf "%s\n" "$@" > "'"${STEP_ARGV}"'" ;; esac
printf "srun-env NCCL_IB_DISABLE=%s APPTAINER_BIND=%s\n" "${NCCL_IB_DISABLE-unset}" "${APPTAINER_BIND-unset}" >> "'"${CALLS}"'"
[ -z "${SINGULARITY_BIND+set}" ] || printf "srun-env SINGULARITY_BIND=%s\n" "${SINGULARITY_BIND}" >> "'"${CALLS}"'"
[ -z "${DDP_RECOVERY+set}" ] || printf "srun-env DDP_RECOVERY=%s\n" "${DDP_RECOVERY}" >> "'"${CALLS}"'"
# The preflight: a doctor report per node of the step (its --nodelist, or the first --nodes of the
# job'"'"'s SLURM_JOB_NODELIST as scontrol expands it), where --output=...%N says; $DOCTOR_FAILS names the
# failing nodes (words).
case " $* " in *" doctor --json "*)
    if [ -n "${nodelist}" ]; then
        step_nodes="${nodelist//,/ }"
    else
        step_nodes="$(scontrol show hostnames "${SLURM_JOB_NODELIST:-node[1-${nodes}]}" | head -n "${nodes}")"
    fi
    for node in ${step_nodes}; do
        ok=true; [[ " ${DOCTOR_FAILS:-} " == *" ${node} "* ]] && ok=false
        printf "{\"ok\": %s, \"checks\": [{\"name\": \"interface\", \"status\": \"%s\", \"detail\": \"eth0 missing\", \"fix\": \"unset NCCL_SOCKET_IFNAME\"}]}\n" \
            "${ok}" "$([ "${ok}" = true ] && echo OK || echo FAIL)" > "${output//%N/${node}}"
    done
    exit 0 ;;
esac
# The fabric gate: $GATE_REPORT becomes its gate.json, $GATE_STATUS its exit status.
case " $* " in *" ddp_train.gate "*)
    [ -z "${GATE_REPORT:-}" ] || cp "${GATE_REPORT}" "${DDP_RUN_DIR}/gate.json"
    exit "${GATE_STATUS:-0}" ;;
esac
# The training step. With $SRUN_WAITS_FOR_STOP=1 it runs until the batch script asks it to stop
# through the run dir, then records the request and exits 75, as the trainer does. $ROLL_CALL_LOSES
# ("node2 node3"): the first training step loses the first node, as the trainer'"'"'s roll call reports
# it (roll-call.json) before it exits 1, the second the second; the steps after them succeed.
case " $* " in *" -- --data-dir "*)
    if [ -n "${ROLL_CALL_LOSES:-}" ]; then
        count_file="'"${BATS_TEST_TMPDIR}"'/training-steps"
        count="$(cat "${count_file}" 2>/dev/null || echo 0)"
        echo "$((count + 1))" > "${count_file}"
        read -r -a lost <<< "${ROLL_CALL_LOSES}"
        if [ "${count}" -lt "${#lost[@]}" ]; then
            printf "{\"lost\": [{\"node\": \"%s\", \"ranks\": [2, 3]}], \"cause\": \"Connection reset by peer\", \"failed_at\": 100.0, \"named_at\": 115.0}\n" \
                "${lost[${count}]}" > "${DDP_RUN_DIR}/roll-call.json"
            exit 1
        fi
    fi
    request="${DDP_RUN_DIR}/.ddp-stop-request"
    [ ! -e "${request}" ] || echo "stop-request-at-start" >> "'"${CALLS}"'"
    if [ "${SRUN_WAITS_FOR_STOP:-0}" = 1 ]; then
        : > "${DDP_RUN_DIR}/.step-waiting"
        for _ in $(seq 200); do
            if [ -e "${request}" ]; then
                printf "stop-request %s\n" "$(cat "${request}")" >> "'"${CALLS}"'"
                exit 75
            fi
            sleep 0.1
        done
        exit 1
    fi ;;
esac
exit "${SRUN_STATUS:-0}"'
    # A job is named by its id or, for one task of an array, <array job id>_<task id> (scontrol(1);
    # https://slurm.schedmd.com/job_array.html).
    _stub scontrol '
job_id() { [[ "$1" =~ ^[0-9]+(_[0-9]+)?$ ]] || { echo "scontrol stub: bad job id $1" >&2; exit 2; }; }
case "${1-} ${2-}" in
    "requeue "* | "requeuehold "* | "release "*) [ "$#" -eq 2 ] && job_id "$2" ;;
    "update JobId="*) [ "$#" -eq 3 ] && job_id "${2#JobId=}" && [ "${3%%=*}" = ExcNodeList ] ;;
    "show hostnames")
        # The job'"'"'s own list expands as SLURM does (node[1-4], node[1,3-4]); the partition'"'"'s (from sinfo)
        # is $PARTITION_NODES, which a test sets to the partition it means.
        if [ "${3-}" = "${SLURM_JOB_NODELIST-}" ] && [[ "${3}" =~ ^([a-z]+)\[([0-9,-]+)\]$ ]]; then
            prefix="${BASH_REMATCH[1]}"
            IFS=, read -r -a ranges <<< "${BASH_REMATCH[2]}"
            for range in "${ranges[@]}"; do
                for n in $(seq "${range%-*}" "${range#*-}"); do printf "%s%s\n" "${prefix}" "${n}"; done
            done
        else
            printf "%s\n" ${PARTITION_NODES:-node1 node2}
        fi ;;
    *) echo "scontrol stub: unknown arguments $*" >&2; exit 2 ;;
esac'
    _stub sinfo '[ "$*" = "-h -p e2e -o %N" ] || { echo "sinfo stub: unknown arguments $*" >&2; exit 2; }; echo "node[1-3]"'
    _stub apptainer 'echo "apptainer stub: must only be reached through srun" >&2; exit 2'
    _stub singularity 'echo "singularity stub: must only be reached through srun" >&2; exit 2'
    _stub sbatch 'echo "sbatch stub: job scripts must not submit jobs" >&2; exit 2'
    # The host python3: the binds request is answered with one bind; the dataset check
    # (python3 -m ddp_contract), the settings word splitter (python3 -m ddp_contract.shell_words),
    # the site's GPU vendor (python3 -m ddp_launch.accelerators) and srun options (python3 -m
    # ddp_launch.sites), both from the repo's site profiles, and a test's own python3 -c run for real.
    local -r real_python3="$(command -v python3)"
    _stub python3 '
case "${1-} ${2-} ${3-} $#" in
    "-m ddp_launch.binds --site 4") echo "/host/${4}:/opt/${4}" ;;
    "-m ddp_contract dataset 4" | "-m ddp_contract run-dir-lock 4" | "-m ddp_contract.quarantine "* | "-m ddp_contract.spares "* | "-m ddp_contract.shell_words "* | "-c "*) exec "'"${real_python3}"'" "$@" ;;
    "-m ddp_launch.accelerators "* | "-m ddp_launch.sites "*) exec "'"${real_python3}"'" "$@" ;;
    *) echo "python3 stub: unexpected arguments $*" >&2; exit 2 ;;
esac'
}

# A minimal environment of a 2-node batch job, with an image and staged data.
_job_env() {
    export SLURM_JOB_ID=42 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='node[1-2]'
    # sbatch runs the batch script on the job's first node and names it here (sbatch(1)).
    export SLURMD_NODENAME=node1
    export SLURM_SUBMIT_DIR="${REPO}" DDP_MONITOR_INTERVAL=5 SLURM_JOB_PARTITION=e2e
    # The training step's own tests: the steps before it have theirs (fabric_gate.bats).
    export DDP_PREFLIGHT=0 DDP_FABRIC_GATE=0
    export DDP_IMAGE="${BATS_TEST_TMPDIR}/train.sif"
    export DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data"
    export DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run"
    touch "${DDP_IMAGE}"
    mkdir -p "${DDP_DATA_DIR}/cifar-100-python"
    touch "${DDP_DATA_DIR}/cifar-100-python/"{train,test,meta}
    unset SLURM_NTASKS SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID SLURM_RESTART_COUNT DDP_TRAIN_ARGS DDP_LAUNCH_ARGS DDP_SITE DDP_REPO NCCL_IB_DISABLE APPTAINER_BIND \
        SINGULARITY_BIND DDP_CONTAINER_RUNTIME
}

# The recorded srun call that runs the image (the training step).
_train_call() {
    grep -E '^srun .* (apptainer|singularity) .* -- --data-dir ' "${CALLS}"
}
