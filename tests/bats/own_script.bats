#!/usr/bin/env bats
# A job script running the user's own training script (--script PATH, --module MOD) instead of the built-in
# trainer: what each step is given, with srun and friends stubbed (tests/bats/stubs).

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _job_env
    TRAIN_PY="${BATS_TEST_TMPDIR}/code/train.py"
    mkdir -p "${BATS_TEST_TMPDIR}/code"
    printf 'import sys\nprint(sys.argv)\n' > "${TRAIN_PY}"
    export TRAIN_PY
}

# The recorded srun call of the training step (the image's step that is neither the doctor nor the gate).
_workload_call() {
    grep -E '^srun .* (apptainer|singularity) ' "${CALLS}" | grep -v -e ' doctor --json ' -e ' ddp_train.gate '
}

@test "--script first: the training step runs the script with exactly the user's arguments, no trainer flags" {
    run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}" --lr 0.1 --epochs 3

    assert_success
    run _workload_call
    assert_output "srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get apptainer run --nv ${DDP_IMAGE} --site olivia --log-dir ${DDP_RUN_DIR}/logs/42 --script ${TRAIN_PY} -- --lr 0.1 --epochs 3"
    # The data and run dirs reach it as variables, not flags; and the stop request's file and the resume flag.
    run grep '^srun-workload-env' "${CALLS}"
    assert_output "srun-workload-env DDP_RUN_DIR=${DDP_RUN_DIR} DDP_DATA_DIR=${DDP_DATA_DIR} DDP_STOP_REQUEST=${DDP_RUN_DIR}/.ddp-stop-request DDP_RESUME=0 DDP_VENV=unset"
}

@test "a relative --script is the file in the directory the job was submitted from, for every node and step" {
    cd "${BATS_TEST_TMPDIR}"

    run bash "${REPO}/slurm/raven-task-per-gpu.sh" --script code/train.py

    assert_success
    run _workload_call
    assert_output --regexp " --mode slurm-task --script ${TRAIN_PY} --$"  # no arguments given, none added
}

@test "--module names a module of the user's, with its arguments" {
    run bash "${REPO}/slurm/ethernet-gloo.sh" --module mypkg.train --steps 5

    assert_success
    run _workload_call
    assert_output --partial " --cpu-workers 1 --log-dir ${DDP_RUN_DIR}/logs/42 --module mypkg.train -- --steps 5"
}

@test "a script named in DDP_LAUNCH_ARGS: the gate and the doctor still run our own, the training the script" {
    export DDP_PREFLIGHT=1 DDP_FABRIC_GATE=1 DDP_LAUNCH_ARGS="--script ${TRAIN_PY} --max-restarts 1"

    run bash "${REPO}/slurm/olivia-multinode.sh" --steps 7

    assert_success
    refute_output --partial "fabric gate failed"
    run grep -E '^srun .* ddp_train.gate ' "${CALLS}"
    assert_output "srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get apptainer run --nv ${DDP_IMAGE} --site olivia --log-dir ${DDP_RUN_DIR}/logs/gate-42 --max-restarts 1 --module ddp_train.gate -- --run-dir ${DDP_RUN_DIR} --site olivia --backend auto"
    run grep -E '^srun .* doctor --json ' "${CALLS}"
    assert_output --partial " doctor --json --site olivia --script ${TRAIN_PY} --data-dir ${DDP_DATA_DIR}"
    run _workload_call
    assert_output --partial " --site olivia --log-dir ${DDP_RUN_DIR}/logs/42 --max-restarts 1 --script ${TRAIN_PY} -- --steps 7"
}

@test "the gate's backend is auto for a user's script, whatever flags of its own it takes" {
    export DDP_FABRIC_GATE=1

    run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}" --backend gloo

    assert_success
    run grep -E '^srun .* ddp_train.gate ' "${CALLS}"
    assert_output --partial " -- --run-dir ${DDP_RUN_DIR} --site olivia --backend auto"
}

@test "a user's script needs no CIFAR-100: without staged data the job runs, with no DDP_DATA_DIR" {
    rm -r "${DDP_DATA_DIR}"
    export DDP_PREFLIGHT=1

    run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}"

    assert_success
    assert_output --partial "ddp: DDP_DATA_DIR=${DDP_DATA_DIR} does not exist: the workload gets no DDP_DATA_DIR"
    refute_output --partial "lacks"
    run grep '^srun-env NCCL' "${CALLS}"
    assert_line "srun-env NCCL_IB_DISABLE=unset APPTAINER_BIND=/host/olivia:/opt/olivia,${DDP_RUN_DIR}:${DDP_RUN_DIR}"
    run grep -E '^srun .* doctor --json ' "${CALLS}"
    assert_output --regexp " doctor --json --site olivia --script ${TRAIN_PY}$"
}

@test "an explicitly empty DDP_TRAIN_ARGS gives the built-in trainer no flags, not the script's defaults" {
    export DDP_TRAIN_ARGS=""

    run bash "${REPO}/slurm/olivia-multinode.sh" --epochs 3

    assert_success
    run _train_call
    assert_output --regexp " -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --epochs 3$"
}

@test "the job script's trainer defaults never reach a user's script; DDP_TRAIN_ARGS that the user set does" {
    run bash "${REPO}/slurm/olivia-1gpu.sh" --script "${TRAIN_PY}" --x 1
    assert_success
    run _workload_call
    assert_output --regexp " --script ${TRAIN_PY} -- --x 1$"

    : > "${CALLS}"
    DDP_TRAIN_ARGS="--config 'my run.yaml'" run bash "${REPO}/slurm/olivia-1gpu.sh" --script "${TRAIN_PY}" --x 1
    assert_success
    run cat "${STEP_ARGV}"
    assert_output --partial "--script
${TRAIN_PY}
--
--config
my run.yaml
--x
1"
}

@test "a --script that is not a file on the node stops the job in one line, exit 2, before any srun" {
    run bash "${REPO}/slurm/olivia-multinode.sh" --script no/such/train.py

    assert_failure 2
    assert_output "ddp: error: --script no/such/train.py is not a file on $(hostname -s) (${PWD}/no/such/train.py): give the path of your training script, relative to the directory you submit from or absolute"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "--script and --module together, or the workload named twice or late, is one line, exit 2, before any srun" {
    DDP_LAUNCH_ARGS="--script ${TRAIN_PY} --module pkg.train" run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 2
    assert_output "ddp: error: DDP_LAUNCH_ARGS names 2 workloads (--script ${TRAIN_PY}, --module pkg.train): give one, --script PATH or --module MOD"

    DDP_LAUNCH_ARGS="--module pkg.train" run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}"
    assert_failure 2
    assert_output "ddp: error: the workload is named twice, in DDP_LAUNCH_ARGS (--module pkg.train) and in the arguments (--script ${TRAIN_PY}): name it once, as the first arguments (--script PATH ARGS...)"

    run bash "${REPO}/slurm/olivia-multinode.sh" --epochs 2 --script "${TRAIN_PY}"
    assert_failure 2
    assert_output "ddp: error: --script comes after other arguments (--epochs 2): name the workload first, as --script PATH ARGS... (the arguments after it are all the workload's)"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "a user's script that exits 75 with nothing to resume from is requeued, but only DDP_MAX_REQUEUES times" {
    export SRUN_STATUS=75 SLURM_RESTART_COUNT=1
    run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}"
    assert_success
    assert_output --partial "requeuing job 42 (restart 2 of 3)"
    # The requeued run is told it continues an earlier one.
    run grep '^srun-workload-env' "${CALLS}"
    assert_output --partial " DDP_RESUME=1 "

    : > "${CALLS}"
    SLURM_RESTART_COUNT=3 run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}"
    assert_failure 75
    assert_output --partial "already requeued 3 times (DDP_MAX_REQUEUES=3): not requeuing"
    run grep -c '^scontrol' "${CALLS}"
    assert_output "0"
}

@test "USR2 at the time limit reaches a user's script through DDP_STOP_REQUEST, and the job requeues" {
    export SRUN_WAITS_FOR_STOP=1
    bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}" > "${BATS_TEST_TMPDIR}/job.out" 2>&1 &
    local -r job=$!
    for _ in $(seq 100); do
        [ ! -e "${DDP_RUN_DIR}/.step-waiting" ] || break
        sleep 0.1
    done
    kill -USR2 "${job}"
    wait "${job}"

    run grep '^stop-request ' "${CALLS}"
    assert_output "stop-request SIGUSR2"
    run grep '^scontrol requeue' "${CALLS}"
    assert_output "scontrol requeue 42"
    # The script is told where to look: the variable names the file the batch shell wrote.
    run grep '^srun-workload-env' "${CALLS}"
    assert_output --partial " DDP_STOP_REQUEST=${DDP_RUN_DIR}/.ddp-stop-request "
    run _workload_call
    assert_output --regexp " --script ${TRAIN_PY} --$"
}

@test "DDP_VENV is bound into every step; one that is not a directory is one line, exit 2, before any srun" {
    mkdir -p "${BATS_TEST_TMPDIR}/venv"
    DDP_VENV="${BATS_TEST_TMPDIR}/venv" run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}"
    assert_success
    run grep '^srun-env NCCL' "${CALLS}"
    assert_line "srun-env NCCL_IB_DISABLE=unset APPTAINER_BIND=/host/olivia:/opt/olivia,${DDP_DATA_DIR}:${DDP_DATA_DIR},${DDP_RUN_DIR}:${DDP_RUN_DIR},${BATS_TEST_TMPDIR}/venv:${BATS_TEST_TMPDIR}/venv"
    run grep '^srun-workload-env' "${CALLS}"
    assert_output --partial " DDP_VENV=${BATS_TEST_TMPDIR}/venv"

    : > "${CALLS}"
    DDP_VENV="${BATS_TEST_TMPDIR}/no-venv" run bash "${REPO}/slurm/olivia-multinode.sh" --script "${TRAIN_PY}"
    assert_failure 2
    assert_output "ddp: error: DDP_VENV=${BATS_TEST_TMPDIR}/no-venv is not a directory: make the venv in the image first (apptainer exec IMAGE python3 -m venv --system-site-packages --without-pip ${BATS_TEST_TMPDIR}/no-venv; docs/own-script.md), or unset DDP_VENV"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}
