# Shared setup for the bats tests: bats-assert, the repository root, and stubs of
# srun, sbatch, scontrol, sinfo, apptainer, singularity and the host python3 on PATH.
# The stubs are programs in tests/bats/stubs; each appends "name argv..." to $CALLS and rejects
# options it does not know. They read what they need from the environment set here.

_common_setup() {
    load '/usr/lib/bats/bats-support/load'
    load '/usr/lib/bats/bats-assert/load'
    REPO="$(cd "${BATS_TEST_DIRNAME}/../.." && pwd)"
    STUBS="${BATS_TEST_TMPDIR}/bin"
    CALLS="${BATS_TEST_TMPDIR}/calls.log"
    STEP_ARGV="${BATS_TEST_TMPDIR}/step.argv"
    STEP_TASKS="${BATS_TEST_TMPDIR}/step-tasks.log"
    # The python3 stub runs some modules for real, with the python3 found before the stubs.
    REAL_PYTHON3="$(command -v python3)"
    export REPO STUBS CALLS STEP_ARGV STEP_TASKS REAL_PYTHON3 BATS_TEST_TMPDIR
    mkdir -p "${STUBS}"
    : > "${CALLS}"
    _stub srun scontrol sinfo apptainer singularity sbatch python3
    export PATH="${STUBS}:${PATH}"
}

# _stub NAME...: put tests/bats/stubs/NAME on this test's PATH (a copy, which a test may replace).
_stub() {
    local name
    for name in "$@"; do
        cp "${REPO}/tests/bats/stubs/${name}" "${STUBS}/${name}"
    done
}

# _stub_as NAME STUB: put tests/bats/stubs/STUB on this test's PATH as NAME.
_stub_as() {
    local -r name="$1" stub="$2"
    cp "${REPO}/tests/bats/stubs/${stub}" "${STUBS}/${name}"
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
        SINGULARITY_BIND DDP_CONTAINER_RUNTIME SRUN_TRAINING_STEP JOB_OUT
}

# The recorded srun call that runs the image (the training step).
_train_call() {
    grep -E '^srun .* (apptainer|singularity) .* -- --data-dir ' "${CALLS}"
}
