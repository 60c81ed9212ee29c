#!/usr/bin/env bats
# RunAI: the exact `runai submit-dist pytorch` line, and what each pod runs, with
# runai and ddp-launch stubbed on PATH.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _stub runai 'exit 0'
    _stub ddp-launch 'exit 0'
    unset RUNAI_JOB_NAME RUNAI_WORKERS RUNAI_GPUS RUNAI_RDMA RUNAI_POD_SCRIPT RUNAI_EXTRA_ARGS RUNAI_LARGE_SHM
    export RUNAI_IMAGE=registry.example/ddp-train:0.1
    export PYTHONPATH="${REPO}/entrypoints"  # as the image's: pod.sh checks the data with ddp_contract
}

@test "runai submit: one master plus workers, GPUs per pod, the pod script as the command, large shm, RoCE" {
    run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    run cat "${CALLS}"
    assert_output "runai submit-dist pytorch --name ddp-train --workers=1 -g 4 -i registry.example/ddp-train:0.1 --command --large-shm --annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1 -- /opt/ddp/runai/pod.sh --epochs 5"
}

@test "runai submit: settings from the environment, no RDMA, extra flags split on spaces" {
    RUNAI_WORKERS=3 RUNAI_GPUS=2 RUNAI_RDMA=0 RUNAI_LARGE_SHM=0 RUNAI_JOB_NAME=wrn RUNAI_EXTRA_ARGS="--pvc data:/mnt/data" \
        run bash "${REPO}/runai/submit.sh" --batch-size "1 024"

    assert_success
    run cat "${CALLS}"
    assert_output "runai submit-dist pytorch --name wrn --workers=3 -g 2 -i registry.example/ddp-train:0.1 --command --pvc data:/mnt/data -- /opt/ddp/runai/pod.sh --batch-size 1 024"
}

@test "runai submit: a missing image or a bad count is one error line and nothing is submitted" {
    RUNAI_IMAGE= run bash "${REPO}/runai/submit.sh"
    assert_failure
    assert_output --partial "RUNAI_IMAGE is unset"

    RUNAI_WORKERS=two run bash "${REPO}/runai/submit.sh"
    assert_failure
    assert_output "runai/submit.sh: error: RUNAI_WORKERS=two is not a number of worker pods"
    run cat "${CALLS}"
    assert_output ""
}

@test "the pod script the submit line names is baked into the GPU image" {
    run grep -E '^    runai/pod.sh /opt/ddp/runai/pod.sh$' "${REPO}/containers/gpu.def"
    assert_success
}

@test "pod: ddp-launch in kubeflow mode with the rcp site, torchrun logs on the run volume" {
    mkdir -p "${BATS_TEST_TMPDIR}/data/cifar-100-python"
    touch "${BATS_TEST_TMPDIR}/data/cifar-100-python/"{train,test,meta}
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RANK=1 PET_NNODES=2 \
        HOSTNAME=ddp-train-worker-0 run bash "${REPO}/runai/pod.sh" --epochs 5

    assert_success
    assert_output --partial "pod: pod ddp-train-worker-0: rank 1 of 2 pods"
    run grep '^ddp-launch' "${CALLS}"
    assert_output "ddp-launch --mode kubeflow --site rcp --log-dir ${BATS_TEST_TMPDIR}/run/logs -- --data-dir ${BATS_TEST_TMPDIR}/data --run-dir ${BATS_TEST_TMPDIR}/run --epochs 5"
    [ -d "${BATS_TEST_TMPDIR}/run/logs" ]
}

@test "pod: missing data on the volume stops the pod before ddp-launch" {
    mkdir -p "${BATS_TEST_TMPDIR}/partial/cifar-100-python"
    touch "${BATS_TEST_TMPDIR}/partial/cifar-100-python/train"
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/partial" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" \
        run bash "${REPO}/runai/pod.sh"

    assert_failure 1
    assert_output --partial "pod: error: ${BATS_TEST_TMPDIR}/partial/cifar-100-python lacks test, meta: stage it on the PVC"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}
