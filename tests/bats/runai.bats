#!/usr/bin/env bats
# RunAI: the exact `runai submit-dist pytorch` line, and what each pod runs, with
# runai and ddp-launch stubbed on PATH.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    # runai and ddp-launch accept anything; date gives the UTC time that names a new run ($NOW).
    _stub runai ddp-launch date
    unset RUNAI_JOB_NAME RUNAI_WORKERS RUNAI_GPUS RUNAI_RDMA RUNAI_POD_SCRIPT RUNAI_EXTRA_ARGS RUNAI_LARGE_SHM \
        RUNAI_DATA_DIR RUNAI_RUN_DIR RUNAI_DATA_SUBDIR RUNAI_RUN_SUBDIR RUNAI_RESUME KUBERNETES_SERVICE_HOST NOW SHM_KB
    export RUNAI_IMAGE=registry.example/ddp-train:0.1 RUNAI_DATA_PVC=scratch RUNAI_RUN_PVC=scratch
    export PYTHONPATH="${REPO}/entrypoints"  # as the image's: pod.sh checks the data with ddp_contract
}

@test "runai submit: one master plus workers, GPUs per pod, the pod script as the command, large shm, RoCE" {
    run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    assert_output "runai/submit.sh: a new run, ddp-train-20260101-120000, in /mnt/runs/ddp-train-20260101-120000 (RUNAI_RESUME=ddp-train-20260101-120000 continues it)"
    run grep '^runai ' "${CALLS}"
    assert_output "runai submit-dist pytorch --name ddp-train --workers=1 -g 4 -i registry.example/ddp-train:0.1 --command --large-shm --annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1 --existing-pvc claimname=scratch,path=/mnt/data --existing-pvc claimname=scratch,path=/mnt/runs -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR=/mnt/runs/ddp-train-20260101-120000 -- /opt/ddp/runai/pod.sh --epochs 5"
}

@test "runai submit: settings from the environment, no RDMA, extra flags as words" {
    RUNAI_WORKERS=3 RUNAI_GPUS=2 RUNAI_RDMA=0 RUNAI_LARGE_SHM=0 RUNAI_JOB_NAME=wrn RUNAI_EXTRA_ARGS="--node-pools a100 --preemptible" \
        RUNAI_DATA_PVC=cifar RUNAI_DATA_DIR=/data RUNAI_RUN_PVC=home.user RUNAI_RUN_DIR=/home/u/runs \
        run bash "${REPO}/runai/submit.sh" --batch-size "1 024"

    assert_success
    run grep '^runai ' "${CALLS}"
    assert_output "runai submit-dist pytorch --name wrn --workers=3 -g 2 -i registry.example/ddp-train:0.1 --command -e NCCL_IB_DISABLE=1 --existing-pvc claimname=cifar,path=/data --existing-pvc claimname=home.user,path=/home/u/runs -e DDP_DATA_DIR=/data -e DDP_RUN_DIR=/home/u/runs/wrn-20260101-120000 --node-pools a100 --preemptible -- /opt/ddp/runai/pod.sh --batch-size 1 024"
}

# RUNAI_EXTRA_ARGS is split as the SLURM job scripts split DDP_TRAIN_ARGS: the shell's quoting,
# no expansion (POSIX sh, "Quoting"; Python's shlex in POSIX mode).
@test "runai submit: RUNAI_EXTRA_ARGS is split with the shell's quoting: a quoted argument with spaces stays one word" {
    RUNAI_EXTRA_ARGS="--node-pools a100 -e 'NOTE=two words' --label \"\$HOME\" -e GLOB='*'" \
        run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    run sed -n '/^-e$/,$p' "${BATS_TEST_TMPDIR}/runai.argv"
    assert_output "$(printf '%s\n' -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR=/mnt/runs/ddp-train-20260101-120000 \
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

    RUNAI_RUN_PVC=runs RUNAI_RUN_DIR=/mnt/data run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output "runai/submit.sh: error: RUNAI_RUN_DIR and RUNAI_DATA_DIR are both /mnt/data for two claims (scratch, runs): give each claim its own mount point"
    run grep -c '^runai ' "${CALLS}"
    assert_output "0"
}

# A new submission is a new run: RunAI frees a job's name once the job is deleted, and a run dir
# named after the job alone held the old run, which the trainer then continued (or found done).
@test "runai submit: each submission under one job name trains a new run; RUNAI_RESUME continues a named one" {
    NOW=20260101-120000 run bash "${REPO}/runai/submit.sh" --epochs 5
    assert_success
    run grep '^DDP_RUN_DIR=' "${BATS_TEST_TMPDIR}/runai.argv"
    assert_output "DDP_RUN_DIR=/mnt/runs/ddp-train-20260101-120000"

    NOW=20260102-083000 run bash "${REPO}/runai/submit.sh" --epochs 5
    assert_success
    run grep '^DDP_RUN_DIR=' "${BATS_TEST_TMPDIR}/runai.argv"
    assert_output "DDP_RUN_DIR=/mnt/runs/ddp-train-20260102-083000"

    # The trainer's --resume refuses a run dir without a checkpoint: a mistyped name is an error.
    RUNAI_RESUME=ddp-train-20260101-120000 run bash "${REPO}/runai/submit.sh" --epochs 9
    assert_success
    assert_output "runai/submit.sh: continuing run ddp-train-20260101-120000 in /mnt/runs/ddp-train-20260101-120000"
    run sed -n '/^DDP_RUN_DIR=/,$p' "${BATS_TEST_TMPDIR}/runai.argv"
    assert_output "$(printf '%s\n' DDP_RUN_DIR=/mnt/runs/ddp-train-20260101-120000 -- /opt/ddp/runai/pod.sh --resume --epochs 9)"
}

@test "runai submit: RUNAI_RESUME that is not a run's name is one line, exit 2, nothing submitted" {
    for bad in ../other /mnt/runs/x "a b"; do
        RUNAI_RESUME="${bad}" run bash "${REPO}/runai/submit.sh"
        assert_failure 2
        assert_output --partial "runai/submit.sh: error: RUNAI_RESUME=${bad} is not a run's name: "
    done
    run grep -c '^runai ' "${CALLS}"
    assert_output "0"
}

# EPFL RCP keeps each user's files under /mloscratch/homes/<user>/ on one shared claim
# (epfml/getting-started, docs/README.md; its runai examples mount runai-mlo-<user>-scratch at
# /mloscratch). The claim is mounted once, whole, and the data and the runs are paths below it.
@test "runai submit: data and runs in subdirectories of one shared claim, mounted once" {
    RUNAI_DATA_PVC=runai-mlo-alice-scratch RUNAI_RUN_PVC=runai-mlo-alice-scratch \
        RUNAI_DATA_DIR=/mloscratch RUNAI_RUN_DIR=/mloscratch \
        RUNAI_DATA_SUBDIR=homes/alice/data RUNAI_RUN_SUBDIR=homes/alice/runs/ \
        run bash "${REPO}/runai/submit.sh"

    assert_success
    run grep '^runai ' "${CALLS}"
    assert_output --partial " --existing-pvc claimname=runai-mlo-alice-scratch,path=/mloscratch -e DDP_DATA_DIR=/mloscratch/homes/alice/data -e DDP_RUN_DIR=/mloscratch/homes/alice/runs/ddp-train-20260101-120000 -- "
    run grep -o -- '--existing-pvc' "${CALLS}"
    assert_output "--existing-pvc"
}

@test "runai submit: a subdirectory that leaves the claim or is absolute is one line, exit 2" {
    for bad in /mloscratch/homes/alice ../bob homes/../../etc "homes/a,b"; do
        RUNAI_DATA_SUBDIR="${bad}" run bash "${REPO}/runai/submit.sh"
        assert_failure 2
        assert_output --partial "runai/submit.sh: error: RUNAI_DATA_SUBDIR=${bad} must be a path inside the claim, relative to its root"
    done
    RUNAI_RUN_SUBDIR=/abs run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output --partial "RUNAI_RUN_SUBDIR=/abs must be a path inside the claim"
    run grep -c '^runai ' "${CALLS}"
    assert_output "0"
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

@test "pod: the preflight, then ddp-launch in kubeflow mode with the rcp site, torchrun logs on the run volume" {
    mkdir -p "${BATS_TEST_TMPDIR}/data/cifar-100-python"
    touch "${BATS_TEST_TMPDIR}/data/cifar-100-python/"{train,test,meta}
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RANK=1 PET_NNODES=2 \
        HOSTNAME=ddp-train-worker-0 run bash "${REPO}/runai/pod.sh" --epochs 5

    assert_success
    assert_output --partial "pod: pod ddp-train-worker-0: rank 1 of 2 pods"
    run grep '^ddp-launch' "${CALLS}"
    # ddp-launch preflight (entrypoints/ddp_launch/preflight.py) execs the launch after its `--` once it passed.
    assert_output "ddp-launch preflight --site rcp --data-dir ${BATS_TEST_TMPDIR}/data --run-dir ${BATS_TEST_TMPDIR}/run -- --mode kubeflow --site rcp --log-dir ${BATS_TEST_TMPDIR}/run/logs -- --data-dir ${BATS_TEST_TMPDIR}/data --run-dir ${BATS_TEST_TMPDIR}/run --epochs 5"
    [ -d "${BATS_TEST_TMPDIR}/run/logs" ]
}

@test "pod: a run dir the pod's user cannot write is one line with the fix, exit 2, before ddp-launch" {
    _stage_data
    touch "${BATS_TEST_TMPDIR}/claim"  # not a directory: mkdir fails as it does on a claim of another uid
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/claim/run" run bash "${REPO}/runai/pod.sh"

    assert_failure 2
    [ "${#lines[@]}" -eq 2 ]  # the pod's line, then the error
    assert_line --index 1 --regexp "^pod: error: cannot write the run dir ${BATS_TEST_TMPDIR}/claim/run \(mkdir: .*Not a directory\) as uid $(id -u) gid $(id -g): ${BATS_TEST_TMPDIR}/claim is uid $(id -u) gid $(id -g), mode [0-7]+; submit the pods as its owner \(runai submit ... --run-as-uid UID --run-as-gid GID, as RCP's csub.py does\) or make ${BATS_TEST_TMPDIR}/claim writable for uid $(id -u)$"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}

@test "pod: without DDP_RUN_DIR the pod stops in one line, exit 2: it cannot tell a new job from its own restart" {
    _stage_data
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" HOSTNAME=ddp-train-master-0 run bash "${REPO}/runai/pod.sh"

    assert_failure 2
    assert_output "pod: error: DDP_RUN_DIR is unset: submit with runai/submit.sh (a run dir per submission), or set it in the pod spec to a new directory per run (an earlier run's to continue it)"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}

@test "pod: missing data on the volume stops the pod before ddp-launch" {
    mkdir -p "${BATS_TEST_TMPDIR}/partial/cifar-100-python"
    touch "${BATS_TEST_TMPDIR}/partial/cifar-100-python/train"
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/partial" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" \
        run bash "${REPO}/runai/pod.sh"

    assert_failure 2
    # In a pod: no Makefile, no login node; what stages the data from a pod (ddp_contract.place).
    assert_output --partial "pod: error: ${BATS_TEST_TMPDIR}/partial/cifar-100-python lacks test, meta: stage it on the claim once, from a pod that mounts it: python3 -m ddp_contract download ${BATS_TEST_TMPDIR}/partial (or ddp-train --download --data-dir ${BATS_TEST_TMPDIR}/partial; RunAI: runai submit ... --command -- python3 -m ddp_contract download ${BATS_TEST_TMPDIR}/partial)"
    refute_output --partial "make data"
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
    _stub df
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RUNAI_NUM_OF_GPUS=4 \
        run bash "${REPO}/runai/pod.sh"

    assert_failure 2
    assert_line "pod: error: /dev/shm is 64 MiB, and NCCL between the 4 GPUs of this pod needs at least 1 GiB: submit with runai's --large-shm (runai/submit.sh adds it unless RUNAI_LARGE_SHM=0)"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}

@test "pod: a large /dev/shm, or one GPU per pod, goes on to ddp-launch" {
    _stage_data
    _stub df
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RUNAI_NUM_OF_GPUS=1 \
        run bash "${REPO}/runai/pod.sh"
    assert_success

    export SHM_KB=263174212
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run" RUNAI_NUM_OF_GPUS=8 \
        run bash "${REPO}/runai/pod.sh"
    assert_success
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "2"
}
