#!/usr/bin/env bats
# RunAI and Kubeflow pods running the user's own script (--script PATH): what runai/submit.sh submits and
# what runai/pod.sh hands ddp-launch, with runai (the CLI's stand-in) and ddp-launch stubbed on PATH.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _stub runai ddp-launch date id
    export RUNAI_FAKE_CLI=v1 RUNAI_FAKE_STATE="${BATS_TEST_TMPDIR}/runai"
    unset RUNAI_CLI RUNAI_JOB_NAME RUNAI_WORKERS RUNAI_GPUS RUNAI_RDMA RUNAI_POD_SCRIPT RUNAI_EXTRA_ARGS RUNAI_LARGE_SHM \
        RUNAI_DATA_DIR RUNAI_RUN_DIR RUNAI_DATA_SUBDIR RUNAI_RUN_SUBDIR RUNAI_RESUME KUBERNETES_SERVICE_HOST NOW SHM_KB
    export RUNAI_IMAGE=registry.example/ddp-train:0.1 RUNAI_DATA_PVC=scratch RUNAI_RUN_PVC=scratch RUNAI_RUN_AS=224954:11259
    export PYTHONPATH="${REPO}/entrypoints"  # as the image's
    CLAIM="${BATS_TEST_TMPDIR}/claim"
    mkdir -p "${CLAIM}/code"
    printf 'print("mine")\n' > "${CLAIM}/code/train.py"
}

_runai_argv() {
    tr '\0' '\n' < "${RUNAI_FAKE_STATE}/argv"
}

@test "runai submit: the pods run the script at its path on the claim with exactly its arguments" {
    run bash "${REPO}/runai/submit.sh" --script /mnt/runs/code/train.py --lr 0.1

    assert_success
    refute_output --partial "note:"
    run sed -n '/^--$/,$p' <(_runai_argv)
    assert_output "$(printf '%s\n' -- /opt/ddp/runai/pod.sh --script /mnt/runs/code/train.py --lr 0.1)"
}

@test "runai submit: RUNAI_RESUME tells a user's script DDP_RESUME=1, never the trainer's --resume" {
    RUNAI_RESUME=ddp-train-20260101-120000-abcd run bash "${REPO}/runai/submit.sh" --script /mnt/runs/code/train.py

    assert_success
    run _runai_argv
    assert_line "DDP_RESUME=1"
    refute_line "--resume"
    run sed -n '/^--$/,$p' <(_runai_argv)
    assert_output "$(printf '%s\n' -- /opt/ddp/runai/pod.sh --script /mnt/runs/code/train.py)"
}

@test "runai submit: a relative script path is one line, exit 2; one under no mount point a note" {
    run bash "${REPO}/runai/submit.sh" --script code/train.py
    assert_failure 2
    assert_output "runai/submit.sh: error: --script code/train.py must be the script's absolute path in the pods: on a claim they mount (e.g. /mnt/runs/code/train.py) or in the image"
    [ ! -e "${RUNAI_FAKE_STATE}/argv" ]

    run bash "${REPO}/runai/submit.sh" --script /opt/mine/train.py
    assert_success
    assert_line --index 0 "runai/submit.sh: note: --script /opt/mine/train.py is under neither mount point (/mnt/data, /mnt/runs): the pods see it only if the image holds it"
}

@test "pod: a user's script needs no CIFAR-100: the preflight gets the workload, the launch exactly its arguments" {
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/no-data" DDP_RUN_DIR="${CLAIM}/run" \
        run bash "${REPO}/runai/pod.sh" --script "${CLAIM}/code/train.py" --steps 40

    assert_success
    assert_line "pod: workload: --script ${CLAIM}/code/train.py, with 2 argument(s) of its own"
    run grep '^ddp-launch' "${CALLS}"
    assert_output "ddp-launch preflight --site rcp --run-dir ${CLAIM}/run -- --mode kubeflow --site rcp --log-dir ${CLAIM}/run/logs --script ${CLAIM}/code/train.py -- --steps 40"
}

@test "pod: a script the pod does not see is one line naming where the pods see files, exit 2, before ddp-launch" {
    KUBERNETES_SERVICE_HOST=10.96.0.1 DDP_RUN_DIR="${CLAIM}/run" \
        run bash "${REPO}/runai/pod.sh" --script /mnt/elsewhere/train.py

    assert_failure 2
    assert_line --index 1 "pod: error: --script /mnt/elsewhere/train.py is not a file on $(hostname -s) (/mnt/elsewhere/train.py): the pods see only their image and the volumes they mount: put the script on a claim they mount (the run or data claim of runai/submit.sh, a volume of the Kubeflow manifest) or in the image, and give its path in the pod"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}
