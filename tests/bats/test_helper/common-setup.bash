# Shared setup for the bats tests: bats-assert, the repository root, and stubs of
# srun, sbatch, scontrol, apptainer, nvidia-smi and the host launcher helper on PATH.
# Every stub appends "name argv..." to $CALLS and rejects options it does not know.

_common_setup() {
    load '/usr/lib/bats/bats-support/load'
    load '/usr/lib/bats/bats-assert/load'
    REPO="$(cd "${BATS_TEST_DIRNAME}/../.." && pwd)"
    STUBS="${BATS_TEST_TMPDIR}/bin"
    CALLS="${BATS_TEST_TMPDIR}/calls.log"
    STEP_ARGV="${BATS_TEST_TMPDIR}/step.argv"
    export REPO STUBS CALLS STEP_ARGV
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
for arg in "$@"; do
    case "${arg}" in
        --overlap|--nodes=*|--ntasks-per-node=*|--kill-on-bad-exit=*|--wait=*|--output=*) ;;
        -*) echo "srun stub: unknown option ${arg}" >&2; exit 2 ;;
        *) break ;;
    esac
done
# A training step takes a while; the sampler step beside it must get to record itself.
# Its argv is also kept one word per line, where word boundaries show.
case " $* " in *" apptainer "*) sleep 0.5; printf "%s\n" "$@" > "'"${STEP_ARGV}"'" ;; esac
printf "srun-env NCCL_IB_DISABLE=%s APPTAINER_BIND=%s\n" "${NCCL_IB_DISABLE-unset}" "${APPTAINER_BIND-unset}" >> "'"${CALLS}"'"
exit "${SRUN_STATUS:-0}"'
    _stub scontrol '
case "${1-} ${2-}" in
    "requeue "[0-9]*) [ "$#" -eq 2 ] ;;
    "show hostnames") echo node1; echo node2 ;;
    *) echo "scontrol stub: unknown arguments $*" >&2; exit 2 ;;
esac'
    _stub apptainer 'echo "apptainer stub: must only be reached through srun" >&2; exit 2'
    _stub sbatch 'echo "sbatch stub: job scripts must not submit jobs" >&2; exit 2'
    # The host python3: the binds request is answered with one bind; the dataset check
    # (python3 -m ddp_contract) and the settings word splitter (python3 -c) run for real.
    local -r real_python3="$(command -v python3)"
    _stub python3 '
case "${1-} ${2-} ${3-} $#" in
    "-m ddp_launch.binds --site 4") echo "/host/${4}:/opt/${4}" ;;
    "-m ddp_contract dataset 4" | "-m ddp_contract run-dir-lock 4" | "-c "*) exec "'"${real_python3}"'" "$@" ;;
    *) echo "python3 stub: unexpected arguments $*" >&2; exit 2 ;;
esac'
}

# A minimal environment of a 2-node batch job, with an image and staged data.
_job_env() {
    export SLURM_JOB_ID=42 SLURM_JOB_NUM_NODES=2 SLURM_JOB_NODELIST='node[1-2]'
    export SLURM_SUBMIT_DIR="${REPO}" DDP_MONITOR_INTERVAL=5
    export DDP_IMAGE="${BATS_TEST_TMPDIR}/train.sif"
    export DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data"
    export DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run"
    touch "${DDP_IMAGE}"
    mkdir -p "${DDP_DATA_DIR}/cifar-100-python"
    touch "${DDP_DATA_DIR}/cifar-100-python/"{train,test,meta}
    unset SLURM_RESTART_COUNT DDP_TRAIN_ARGS DDP_LAUNCH_ARGS DDP_SITE DDP_REPO NCCL_IB_DISABLE APPTAINER_BIND
}

# The recorded srun call that runs apptainer (the training step).
_train_call() {
    grep '^srun .* apptainer ' "${CALLS}"
}
