#!/usr/bin/env bats
# RunAI: the exact `runai submit-dist pytorch` line, and what each pod runs, with
# runai and ddp-launch stubbed on PATH.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _stub runai 'exit 0'
    _stub ddp-launch 'exit 0'
    unset RUNAI_JOB_NAME RUNAI_WORKERS RUNAI_GPUS RUNAI_RDMA RUNAI_POD_SCRIPT RUNAI_EXTRA_ARGS RUNAI_LARGE_SHM \
        RUNAI_DATA_DIR RUNAI_RUN_DIR KUBERNETES_SERVICE_HOST
    export RUNAI_IMAGE=registry.example/ddp-train:0.1 RUNAI_DATA_PVC=scratch RUNAI_RUN_PVC=scratch
    export PYTHONPATH="${REPO}/entrypoints"  # as the image's: pod.sh checks the data with ddp_contract
}

@test "runai submit: one master plus workers, GPUs per pod, the pod script as the command, large shm, RoCE" {
    run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    run cat "${CALLS}"
    assert_output "runai submit-dist pytorch --name ddp-train --workers=1 -g 4 -i registry.example/ddp-train:0.1 --command --large-shm --annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1 --existing-pvc claimname=scratch,path=/mnt/data --existing-pvc claimname=scratch,path=/mnt/runs -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR=/mnt/runs/ddp-train -- /opt/ddp/runai/pod.sh --epochs 5"
}

@test "runai submit: settings from the environment, no RDMA, extra flags as words" {
    RUNAI_WORKERS=3 RUNAI_GPUS=2 RUNAI_RDMA=0 RUNAI_LARGE_SHM=0 RUNAI_JOB_NAME=wrn RUNAI_EXTRA_ARGS="--node-pools a100 --preemptible" \
        RUNAI_DATA_PVC=cifar RUNAI_DATA_DIR=/data RUNAI_RUN_PVC=home.user RUNAI_RUN_DIR=/home/u/runs \
        run bash "${REPO}/runai/submit.sh" --batch-size "1 024"

    assert_success
    run grep '^runai ' "${CALLS}"
    assert_output "runai submit-dist pytorch --name wrn --workers=3 -g 2 -i registry.example/ddp-train:0.1 --command --existing-pvc claimname=cifar,path=/data --existing-pvc claimname=home.user,path=/home/u/runs -e DDP_DATA_DIR=/data -e DDP_RUN_DIR=/home/u/runs/wrn --node-pools a100 --preemptible -- /opt/ddp/runai/pod.sh --batch-size 1 024"
}

# RUNAI_EXTRA_ARGS is split as the SLURM job scripts split DDP_TRAIN_ARGS: the shell's quoting,
# no expansion (POSIX sh, "Quoting"; Python's shlex in POSIX mode).
@test "runai submit: RUNAI_EXTRA_ARGS is split with the shell's quoting: a quoted argument with spaces stays one word" {
    _stub runai 'printf "%s\n" "$@" > "'"${BATS_TEST_TMPDIR}/runai.argv"'"'
    RUNAI_EXTRA_ARGS="--node-pools a100 -e 'NOTE=two words' --label \"\$HOME\" -e GLOB='*'" \
        run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    run sed -n '/^-e$/,$p' "${BATS_TEST_TMPDIR}/runai.argv"
    assert_output "$(printf '%s\n' -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR=/mnt/runs/ddp-train \
        --node-pools a100 -e 'NOTE=two words' --label '$HOME' -e 'GLOB=*' -- /opt/ddp/runai/pod.sh --epochs 5)"
}

@test "runai submit: RUNAI_EXTRA_ARGS with an unclosed quote is one error line, exit 2, nothing submitted" {
    RUNAI_EXTRA_ARGS="-e 'NOTE=unclosed" run bash "${REPO}/runai/submit.sh"

    assert_failure 2
    assert_output "runai/submit.sh: error: RUNAI_EXTRA_ARGS=\"-e 'NOTE=unclosed\" is not words of the shell (No closing quotation): close each quote as in the shell, e.g. \"a b\""
    run grep -c '^runai ' "${CALLS}"
    assert_output "0"
}

# The data and the runs live on PVCs the user names: `--existing-pvc claimname=NAME,path=PATH`
# (Run:ai CLI reference, runai submit-dist pytorch:
# https://docs.run.ai/v2.18/Researcher/cli-reference/runai-submit-dist-pytorch/). Without them
# every pod would stop at the dataset check, so the submit line is refused first.
@test "runai submit: a missing data or run volume is one error line naming the setting, exit 2, nothing submitted" {
    RUNAI_DATA_PVC= run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output --regexp "^runai/submit.sh: error: RUNAI_DATA_PVC is unset: name the PVC that holds cifar-100-python/ .*kubectl get pvc"
    [ "${#lines[@]}" -eq 1 ]

    RUNAI_RUN_PVC= run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output --partial "RUNAI_RUN_PVC is unset"

    RUNAI_DATA_PVC=My_Data run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output --partial "RUNAI_DATA_PVC=My_Data is not a PVC name"

    RUNAI_RUN_DIR=/mnt/data run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output --partial "give each volume its own mount point"
    run cat "${CALLS}"
    assert_output ""
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

    assert_failure 2
    assert_output --partial "pod: error: ${BATS_TEST_TMPDIR}/partial/cifar-100-python lacks test, meta: stage it on the PVC"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}

# A container runtime gives /dev/shm 64 MiB unless told otherwise (docker run --shm-size,
# default 64m; Kubernetes has no field for it: kubernetes#28272), and NCCL between the GPUs of
# one pod needs more (NCCL troubleshooting, "Shared memory": --shm-size=1g,
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html).
_stage_data() {
    mkdir -p "${BATS_TEST_TMPDIR}/data/cifar-100-python"
    touch "${BATS_TEST_TMPDIR}/data/cifar-100-python/"{train,test,meta}
}

@test "pod: a 64 MiB /dev/shm with 4 GPUs stops the pod in one line naming --large-shm, exit 2" {
    _stage_data
    _stub df 'printf "Filesystem 1024-blocks Used Available Capacity Mounted on\nshm 65536 0 65536 0%% /dev/shm\n"'
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RUNAI_NUM_OF_GPUS=4 \
        run bash "${REPO}/runai/pod.sh"

    assert_failure 2
    assert_line "pod: error: /dev/shm is 64 MiB, and NCCL between the 4 GPUs of this pod needs at least 1 GiB: submit with runai's --large-shm (runai/submit.sh adds it unless RUNAI_LARGE_SHM=0)"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}

@test "pod: a large /dev/shm, or one GPU per pod, goes on to ddp-launch" {
    _stage_data
    _stub df 'printf "Filesystem 1024-blocks Used Available Capacity Mounted on\nshm 65536 0 65536 0%% /dev/shm\n"'
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RUNAI_NUM_OF_GPUS=1 \
        run bash "${REPO}/runai/pod.sh"
    assert_success

    _stub df 'printf "Filesystem 1024-blocks Used Available Capacity Mounted on\nshm 263174212 0 263174212 0%% /dev/shm\n"'
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RUNAI_NUM_OF_GPUS=8 \
        run bash "${REPO}/runai/pod.sh"
    assert_success
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "2"
}
