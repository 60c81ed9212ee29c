#!/usr/bin/env bats
# RunAI: the exact `runai submit-dist pytorch` line, and what each pod runs, with
# runai (the CLI's stand-in, tests/bats/stubs/runai) and ddp-launch stubbed on PATH.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    # runai takes what the CLI v1 takes, ddp-launch anything; date gives the UTC time that names a
    # new run ($NOW), id the submitting user's ids.
    _stub runai ddp-launch date id
    export RUNAI_FAKE_CLI=v1 RUNAI_FAKE_STATE="${BATS_TEST_TMPDIR}/runai"
    unset RUNAI_CLI RUNAI_JOB_NAME RUNAI_WORKERS RUNAI_GPUS RUNAI_RDMA RUNAI_POD_SCRIPT RUNAI_EXTRA_ARGS RUNAI_LARGE_SHM \
        RUNAI_DATA_DIR RUNAI_RUN_DIR RUNAI_DATA_SUBDIR RUNAI_RUN_SUBDIR RUNAI_RESUME RUNAI_RUN_PVC_MOUNT \
        KUBERNETES_SERVICE_HOST NOW SHM_KB
    # The user's ids on the cluster (RCP: `id` on haas001.rcp.epfl.ch), which the submit requires.
    export RUNAI_IMAGE=registry.example/ddp-train:0.1 RUNAI_DATA_PVC=scratch RUNAI_RUN_PVC=scratch RUNAI_RUN_AS=224954:11259
    export PYTHONPATH="${REPO}/entrypoints"  # as the image's: pod.sh checks the data with ddp_contract
}

# The last submission's argv, one word per line (the stand-in keeps it NUL-terminated).
_runai_argv() {
    tr '\0' '\n' < "${RUNAI_FAKE_STATE}/argv"
}

# The name of the last workload the stand-in took.
_workload() {
    tail -n 1 "${RUNAI_FAKE_STATE}/workloads"
}

# The submissions in $CALLS (not the CLI's --help probes).
_submit_calls() {
    grep '^runai ' "${CALLS}" | grep -v -- ' --help$'
}

# CLI v1, as its reference gives each flag (runai submit-dist pytorch,
# https://docs.run.ai/v2.18/Researcher/cli-reference/runai-submit-dist-pytorch/; RCP's form,
# epfml/getting-started docs/multinode.md): --name NAME, --workers=N (pods besides the master),
# -g GPUs per pod ("-g | --gpu"), -i IMAGE, --command (what follows `--` replaces the
# ENTRYPOINT), --large-shm, --annotation k8s.v1.cni.cncf.io/networks=kube-system/roce and
# --extended-resource rdma/rdma=1 (RCP's RoCE), --existing-pvc claimname=NAME,path=PATH,
# -e NAME=VALUE; --run-as-uid and --run-as-gid as RCP's csub.py passes them to submit-dist pytorch
# (epfml/getting-started, csub.py); logs: "runai logs JOB_NAME" with -f/--follow (run-ai/runai-cli
# cmd/logs/logs.go). The stand-in takes only the flags of the CLI's reference.
@test "runai submit: one master plus workers, GPUs per pod, the pod script as the command, large shm, RoCE" {
    run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    local -r name="$(_workload)"
    [[ "${name}" =~ ^ddp-train-20260101-120000-[a-z0-9]{4}$ ]]
    assert_line --index 0 "runai/submit.sh: a new run, ${name}, in /mnt/runs/${name} (RUNAI_RESUME=${name} continues it)"
    assert_line --index 1 "runai/submit.sh: its pods run as 224954:11259 (RUNAI_RUN_AS=UID:GID changes it, RUNAI_RUN_AS=image keeps the image's user)"
    assert_line --index 2 "runai/submit.sh: follow it with: runai logs ${name} --follow"
    run _submit_calls
    assert_output "runai submit-dist pytorch --name ${name} --workers=1 -g 4 -i registry.example/ddp-train:0.1 --command --large-shm --annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1 --existing-pvc claimname=scratch,path=/mnt/data --existing-pvc claimname=scratch,path=/mnt/runs -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR=/mnt/runs/${name} --run-as-uid 224954 --run-as-gid 11259 -- /opt/ddp/runai/pod.sh --epochs 5"
}

# CLI v2, as its reference gives each flag (runai training pytorch submit, run-ai/docs
# docs/Researcher/cli-reference/new-cli/runai_training_pytorch_submit.md; now
# https://docs.nvidia.com/run-ai/self-hosted/reference/cli/runai/training/runai-training-pytorch-submit):
# the workload's name as the argument ("runai training pytorch submit <name> -p <project_name> -i
# ..."), --workers int32, -g, --gpu-devices-request int32, -i, --image, -c, --command, --large-shm,
# --annotation, --extended-resource resource_name=quantity, --existing-pvc
# claimname=CLAIM_NAME,path=PATH, -e, --environment, --run-as-uid int, --run-as-gid int; logs:
# "runai training pytorch logs WORKLOAD_NAME --follow" (new-cli/runai_pytorch_logs.md). The
# stand-in takes only the flags of the CLI's reference.
@test "runai submit, CLI v2: runai training pytorch submit NAME with v2's flag names" {
    export RUNAI_FAKE_CLI=v2
    run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    local -r name="$(_workload)"
    [[ "${name}" =~ ^ddp-train-20260101-120000-[a-z0-9]{4}$ ]]
    assert_line --index 0 "runai/submit.sh: a new run, ${name}, in /mnt/runs/${name} (RUNAI_RESUME=${name} continues it)"
    assert_line --index 2 "runai/submit.sh: follow it with: runai training pytorch logs ${name} --follow"
    run _submit_calls
    assert_output "runai training pytorch submit ${name} --workers 1 --gpu-devices-request 4 -i registry.example/ddp-train:0.1 --command --large-shm --annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1 --existing-pvc claimname=scratch,path=/mnt/data --existing-pvc claimname=scratch,path=/mnt/runs -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR=/mnt/runs/${name} --run-as-uid 224954 --run-as-gid 11259 -- /opt/ddp/runai/pod.sh --epochs 5"

    # A second submission in the same second is a workload and a run of its own under v2 too.
    run bash "${REPO}/runai/submit.sh" --epochs 5
    assert_success
    [ "$(_workload)" != "${name}" ]
    run grep -c . "${RUNAI_FAKE_STATE}/workloads"
    assert_output 2
}

# The installed CLI is the one with its PyTorch submit command (v1's reference documents
# `runai submit-dist pytorch`, v2's `runai training pytorch submit`); an unknown command is cobra's
# "unknown command", exit 1. v1, RCP's documented form, is asked first.
@test "runai submit: the CLI is told by its command tree, v1 first; RUNAI_CLI says which instead" {
    run bash "${REPO}/runai/submit.sh"
    assert_success
    run grep '^runai ' "${CALLS}"
    assert_line --index 0 "runai submit-dist pytorch --help"
    assert_line --index 1 --regexp "^runai submit-dist pytorch --name "
    [ "${#lines[@]}" -eq 2 ]

    : > "${CALLS}"
    RUNAI_FAKE_CLI=v2 run bash "${REPO}/runai/submit.sh"
    assert_success
    run grep '^runai ' "${CALLS}"
    assert_line --index 0 "runai submit-dist pytorch --help"
    assert_line --index 1 "runai training pytorch submit --help"
    assert_line --index 2 --regexp "^runai training pytorch submit ddp-train-"
    [ "${#lines[@]}" -eq 3 ]

    : > "${CALLS}"
    RUNAI_FAKE_CLI=v2 RUNAI_CLI=v2 run bash "${REPO}/runai/submit.sh"
    assert_success
    run grep '^runai ' "${CALLS}"
    assert_output --regexp "^runai training pytorch submit ddp-train-[^ ]+ --workers 1 "
}

@test "runai submit: a runai with neither CLI's submit command, or a RUNAI_CLI of neither, is one line, exit 2, nothing submitted" {
    cat > "${STUBS}/runai" <<'EOF'
#!/bin/sh
printf "%s\n" "runai $*" >> "${CALLS}"
echo "Error: unknown command \"$1\" for \"runai\"" >&2
exit 1
EOF
    run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output "runai/submit.sh: error: ${STUBS}/runai has neither 'runai submit-dist pytorch' (RunAI CLI v1) nor 'runai training pytorch submit' (CLI v2): install the CLI from your RunAI cluster's web UI, or set RUNAI_CLI=v1 or v2"
    run _submit_calls
    assert_output ""

    RUNAI_CLI=v3 run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output "runai/submit.sh: error: RUNAI_CLI=v3 is neither v1 (runai submit-dist pytorch) nor v2 (runai training pytorch submit); leave it unset to use the installed CLI's"
}

# RCP's csub.py runs every pod as the user, --run-as-uid and --run-as-gid from the user's LDAP ids in
# its configuration (epfml/getting-started, csub.py: LDAP_UID and LDAP_GID from .env; its README finds
# them with `id` on haas001.rcp.epfl.ch), with the scratch claim whose homes/<user>/ are the user's. The
# submitting machine's ids (a Mac's 501:20, root's 0:0) are no guide: the submit takes no default.
# Both CLIs take the two flags (v2: "--run-as-uid int", "--run-as-gid int").
@test "runai submit: without RUNAI_RUN_AS nothing is submitted, and the line says how to find the cluster's ids" {
    unset RUNAI_RUN_AS
    run bash "${REPO}/runai/submit.sh" --epochs 5
    assert_failure 2
    assert_output "runai/submit.sh: error: RUNAI_RUN_AS is unset: set it to your uid and gid on the cluster, RUNAI_RUN_AS=UID:GID (on RCP: ssh <user>@haas001.rcp.epfl.ch id prints them, the uid= and gid= numbers; RCP's csub.py takes the same two as LDAP_UID and LDAP_GID), or RUNAI_RUN_AS=image for the image's own user"
    run grep -c -e '^runai ' -e '^id ' "${CALLS}"
    assert_output 0
}

@test "runai submit: the pods run as RUNAI_RUN_AS says, or as the image's user" {
    RUNAI_RUN_AS=1000:2000 RUNAI_FAKE_CLI=v2 run bash "${REPO}/runai/submit.sh"
    assert_success
    assert_line --index 1 "runai/submit.sh: its pods run as 1000:2000 (RUNAI_RUN_AS=UID:GID changes it, RUNAI_RUN_AS=image keeps the image's user)"
    run grep -A 3 -x -- --run-as-uid <(_runai_argv)
    assert_output "$(printf '%s\n' --run-as-uid 1000 --run-as-gid 2000)"
    run grep -c '^id ' "${CALLS}"
    assert_output 0

    RUNAI_RUN_AS=image run bash "${REPO}/runai/submit.sh"
    assert_success
    refute_output --partial "run as"
    run grep -c -e --run-as-uid -e --run-as-gid <(_runai_argv)
    assert_output 0
}

@test "runai submit: a RUNAI_RUN_AS that is neither UID:GID nor image is one line, exit 2, nothing submitted" {
    for bad in 1000 alice:mlo 1000: :1000 1000:2000:3000 root; do
        RUNAI_RUN_AS="${bad}" run bash "${REPO}/runai/submit.sh"
        assert_failure 2
        assert_output "runai/submit.sh: error: RUNAI_RUN_AS=${bad} is neither UID:GID nor image: give the numeric user and group the pods run as (on RCP your LDAP ids, from id on haas001.rcp.epfl.ch), or image to keep the image's user"
    done
    run grep -c '^runai ' "${CALLS}"
    assert_output 0
}

@test "runai submit: settings from the environment, no RDMA, extra flags as words" {
    RUNAI_WORKERS=3 RUNAI_GPUS=2 RUNAI_RDMA=0 RUNAI_LARGE_SHM=0 RUNAI_JOB_NAME=wrn RUNAI_EXTRA_ARGS="--node-pools a100 --project mlo-alice" \
        RUNAI_DATA_PVC=cifar RUNAI_DATA_DIR=/data RUNAI_RUN_PVC=home.user RUNAI_RUN_DIR=/home/u/runs \
        run bash "${REPO}/runai/submit.sh" --batch-size "1 024"

    assert_success
    local -r name="$(_workload)"
    [[ "${name}" =~ ^wrn-20260101-120000-[a-z0-9]{4}$ ]]
    run _submit_calls
    assert_output "runai submit-dist pytorch --name ${name} --workers=3 -g 2 -i registry.example/ddp-train:0.1 --command -e NCCL_IB_DISABLE=1 --existing-pvc claimname=cifar,path=/data --existing-pvc claimname=home.user,path=/home/u/runs -e DDP_DATA_DIR=/data -e DDP_RUN_DIR=/home/u/runs/${name} --run-as-uid 224954 --run-as-gid 11259 --node-pools a100 --project mlo-alice -- /opt/ddp/runai/pod.sh --batch-size 1 024"
}

# RUNAI_EXTRA_ARGS is split as the SLURM job scripts split DDP_TRAIN_ARGS: the shell's quoting,
# no expansion (POSIX sh, "Quoting"; Python's shlex in POSIX mode).
@test "runai submit: RUNAI_EXTRA_ARGS is split with the shell's quoting: a quoted argument with spaces stays one word" {
    RUNAI_EXTRA_ARGS="--node-pools a100 -e 'NOTE=two words' --label \"\$HOME\" -e GLOB='*'" \
        run bash "${REPO}/runai/submit.sh" --epochs 5

    assert_success
    run sed -n '/^-e$/,$p' <(_runai_argv)
    assert_output "$(printf '%s\n' -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR="/mnt/runs/$(_workload)" --run-as-uid 224954 --run-as-gid 11259 \
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

# A workload name is a Kubernetes object name, unique in the project until the workload is deleted:
# the stand-in refuses one in use, as Kubernetes does (AlreadyExists).
@test "the runai stand-in refuses a workload name in use, as Kubernetes does" {
    run runai submit-dist pytorch --name ddp-train -i registry.example/ddp-train:0.1 -- true
    assert_success
    run runai submit-dist pytorch --name ddp-train -i registry.example/ddp-train:0.1 -- true
    assert_failure 1
    assert_output "Error: the job ddp-train already exists, please delete it first (use 'runai delete ddp-train')"
}

# Each submission is a workload of its own and a new run, named as the workload: under one
# RUNAI_JOB_NAME, in one second ($NOW does not change), and when continuing a run whose old
# workload may still exist (RunAI keeps a finished one until it is deleted).
@test "runai submit: two submissions in a row are two workloads and two runs; RUNAI_RESUME continues one in a third workload" {
    run bash "${REPO}/runai/submit.sh" --epochs 5
    assert_success
    local -r first="$(_workload)"
    run grep '^DDP_RUN_DIR=' <(_runai_argv)
    assert_output "DDP_RUN_DIR=/mnt/runs/${first}"

    run bash "${REPO}/runai/submit.sh" --epochs 5
    assert_success
    local -r second="$(_workload)"
    [[ "${second}" =~ ^ddp-train-20260101-120000-[a-z0-9]{4}$ ]]
    [ "${second}" != "${first}" ]
    run grep '^DDP_RUN_DIR=' <(_runai_argv)
    assert_output "DDP_RUN_DIR=/mnt/runs/${second}"

    # The trainer's --resume refuses a run dir without a checkpoint: a mistyped name is an error.
    NOW=20260102-083000 RUNAI_RESUME="${first}" run bash "${REPO}/runai/submit.sh" --epochs 9
    assert_success
    local -r third="$(_workload)"
    [[ "${third}" =~ ^ddp-train-20260102-083000-[a-z0-9]{4}$ ]]
    assert_line --index 0 "runai/submit.sh: continuing run ${first} in /mnt/runs/${first}, as workload ${third}"
    run sed -n '/^DDP_RUN_DIR=/,$p' <(_runai_argv)
    assert_output "$(printf '%s\n' "DDP_RUN_DIR=/mnt/runs/${first}" --run-as-uid 224954 --run-as-gid 11259 -- /opt/ddp/runai/pod.sh --resume --epochs 9)"
    run cat "${RUNAI_FAKE_STATE}/workloads"
    assert_output "$(printf '%s\n' "${first}" "${second}" "${third}")"
}

# The prefix and the tail make a DNS-1035 label of at most 49 characters, the RunAI CLI's limit
# (run-ai/runai-cli pkg/util/validate.go; the training operator's PyTorchJob webhook).
@test "runai submit: RUNAI_JOB_NAME is the names' prefix; one that cannot begin a workload name is one line, exit 2" {
    local -r longest=abcdefghij-abcdefghij-abcdef
    RUNAI_JOB_NAME="${longest}" run bash "${REPO}/runai/submit.sh"
    assert_success
    [ "${#longest}" -eq 28 ] && [ "$(_workload | wc -c)" -eq 50 ]

    for bad in Wrn 1wrn wrn_cifar wrn- "${longest}x" "wrn cifar"; do
        RUNAI_JOB_NAME="${bad}" run bash "${REPO}/runai/submit.sh"
        assert_failure 2
        assert_output --partial "runai/submit.sh: error: RUNAI_JOB_NAME=${bad} is not a workload name's prefix: lower-case letters, digits and '-', starting with a letter, ending with a letter or digit, at most 28 characters"
        [ "${#lines[@]}" -eq 1 ]
    done
    run _submit_calls
    assert_output "runai submit-dist pytorch --name $(_workload) --workers=1 -g 4 -i registry.example/ddp-train:0.1 --command --large-shm --annotation k8s.v1.cni.cncf.io/networks=kube-system/roce --extended-resource rdma/rdma=1 --existing-pvc claimname=scratch,path=/mnt/data --existing-pvc claimname=scratch,path=/mnt/runs -e DDP_DATA_DIR=/mnt/data -e DDP_RUN_DIR=/mnt/runs/$(_workload) --run-as-uid 224954 --run-as-gid 11259 -- /opt/ddp/runai/pod.sh"
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
    run _submit_calls
    assert_output --partial " --existing-pvc claimname=runai-mlo-alice-scratch,path=/mloscratch -e DDP_DATA_DIR=/mloscratch/homes/alice/data -e DDP_RUN_DIR=/mloscratch/homes/alice/runs/$(_workload) --run-as-uid 224954 --run-as-gid 11259 -- "
    run grep -o -- '--existing-pvc' <(_submit_calls)
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
    # `make dockerfile` only writes containers/Dockerfile: the line says how to build and push it.
    RUNAI_IMAGE= run bash "${REPO}/runai/submit.sh"
    assert_failure 2
    assert_output "runai/submit.sh: error: RUNAI_IMAGE is unset: build and push the image from the repository root, docker build --platform linux/amd64 -f containers/Dockerfile -t ic-registry.epfl.ch/<project>/ddp-train:<tag> . && docker push ic-registry.epfl.ch/<project>/ddp-train:<tag> (after docker login ic-registry.epfl.ch), then set RUNAI_IMAGE=ic-registry.epfl.ch/<project>/ddp-train:<tag>"

    RUNAI_WORKERS=two run bash "${REPO}/runai/submit.sh"
    assert_failure
    assert_output "runai/submit.sh: error: RUNAI_WORKERS=two is not a number of worker pods"
    run cat "${CALLS}"
    assert_output ""
}

# The staging of the data: one pod of the image, no GPU, as the user, with the data claim at its mount
# point, running what `make data` runs on a login node. v1: `runai submit --name NAME` (csub.py's
# one-pod form; run-ai/docs runai-submit.md), v2: `runai training submit NAME`
# (new-cli/runai_training_submit.md); the stand-in takes only each command's documented flags.
@test "runai submit --download: one pod stages CIFAR-100 into the data dir on the claim, as the user" {
    RUNAI_DATA_PVC=runai-mlo-alice-scratch RUNAI_RUN_PVC=runai-mlo-alice-scratch \
        RUNAI_DATA_DIR=/mloscratch RUNAI_RUN_DIR=/mloscratch RUNAI_DATA_SUBDIR=homes/alice/data \
        run bash "${REPO}/runai/submit.sh" --download

    assert_success
    local -r name="$(_workload)"
    assert_line --index 0 "runai/submit.sh: staging CIFAR-100 into /mloscratch/homes/alice/data (claim runai-mlo-alice-scratch) in one pod, workload ${name}; submit the training once it has ended"
    assert_line --index 1 "runai/submit.sh: follow it with: runai logs ${name} --follow"
    run _submit_calls
    assert_output "runai submit --name ${name} -i registry.example/ddp-train:0.1 --command --existing-pvc claimname=runai-mlo-alice-scratch,path=/mloscratch --run-as-uid 224954 --run-as-gid 11259 -- python3 -m ddp_contract download /mloscratch/homes/alice/data"

    : > "${CALLS}"
    RUNAI_FAKE_CLI=v2 RUNAI_EXTRA_ARGS="-e DDP_CIFAR_URL=file:///mirror/c.tar.gz" run bash "${REPO}/runai/submit.sh" --download
    assert_success
    assert_line --index 1 "runai/submit.sh: follow it with: runai training logs $(_workload) --follow"
    run _submit_calls
    assert_output "runai training submit $(_workload) -i registry.example/ddp-train:0.1 --command --existing-pvc claimname=scratch,path=/mnt/data --run-as-uid 224954 --run-as-gid 11259 -e DDP_CIFAR_URL=file:///mirror/c.tar.gz -- python3 -m ddp_contract download /mnt/data"
    RUNAI_FAKE_CLI=v2 run runai training logs "$(_workload)" --follow
    assert_success
}

@test "runai submit --download with trainer flags or a resume is one line, exit 2, nothing submitted" {
    run bash "${REPO}/runai/submit.sh" --download --epochs 5
    assert_failure 2
    assert_output "runai/submit.sh: error: --download stages CIFAR-100 on the data claim and takes no other trainer flags: run runai/submit.sh --download alone, then submit the training"
    RUNAI_RESUME=ddp-train-20260101-120000-abcd run bash "${REPO}/runai/submit.sh" --download
    assert_failure 2
    assert_output --partial "--download stages the data and continues no run"
    run _submit_calls
    assert_output ""
}

# Where the runs claim is mounted on the submitting machine (RCP's haas001: the scratch claim at
# /mnt/mlo/scratch, epfml/getting-started docs/managing_workflows.md, "The HaaS Machine"), a resume is
# judged there before any pod starts, by the trainer's rule (ddp_contract.same_run) from the summary the
# trainer writes beside each checkpoint.
@test "runai submit: a resume the run's checkpoint cannot take stops here, in one line, where the claim is mounted" {
    local -r claim="${BATS_TEST_TMPDIR}/scratch" run=ddp-train-20260101-120000-abcd
    mkdir -p "${claim}/homes/alice/runs/${run}"
    export RUNAI_RUN_PVC_MOUNT="${claim}" RUNAI_RUN_SUBDIR=homes/alice/runs RUNAI_RESUME="${run}"
    local -r here="${claim}/homes/alice/runs/${run}"

    run bash "${REPO}/runai/submit.sh" --epochs 80
    assert_failure 2
    assert_output "runai/submit.sh: error: RUNAI_RESUME=${run}: ${here} holds no checkpoint.pt (the run stopped before its first): submit it as a new run, without RUNAI_RESUME"

    : > "${here}/checkpoint.pt"
    printf '{"config": {"width_scale": 1.0, "batch_size": 4096, "seed": 0, "recipe": "improved", "epochs": 50}}' > "${here}/checkpoint.json"
    run bash "${REPO}/runai/submit.sh" --epochs 30
    assert_failure 2
    assert_output "runai/submit.sh: error: ${here}/checkpoint.pt is a run of --epochs 50, this run has 30: a resume may train longer, never shorter (the steps taken were scheduled for 50 epochs); pass --epochs 50 or more, or a new run (RUNAI_RESUME unset)"
    run bash "${REPO}/runai/submit.sh" --epochs 80 --width-scale 0.5
    assert_failure 2
    assert_output --partial "was written with --width-scale 1.0, this run has 0.5: use the same value, or a new run (RUNAI_RESUME unset)"
    RUNAI_RESUME=ddp-train-20260101-120000-zzzz run bash "${REPO}/runai/submit.sh" --epochs 80
    assert_failure 2
    assert_output --partial "RUNAI_RESUME=ddp-train-20260101-120000-zzzz: there is no run ${claim}/homes/alice/runs/ddp-train-20260101-120000-zzzz"
    run _submit_calls
    assert_output ""

    # A longer --epochs is taken: the pods continue the run.
    run bash "${REPO}/runai/submit.sh" --epochs 80
    assert_success
    run sed -n '/^--$/,$p' <(_runai_argv)
    assert_output "$(printf '%s\n' -- /opt/ddp/runai/pod.sh --resume --epochs 80)"
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

# A Kubeflow job trains in a run dir named as the job (kubeflow/*.yaml: DDP_RUN_DIR=/mnt/runs/$(JOB_NAME));
# a new job, after the one that started a run is gone, continues it with DDP_RESUME_RUN=<that job's name>.
@test "pod: DDP_RESUME_RUN continues an earlier job's run beside DDP_RUN_DIR, with the trainer's --resume" {
    _stage_data
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/runs/ddp-train-x7k2q" \
        DDP_RESUME_RUN=ddp-train-b4t9z run bash "${REPO}/runai/pod.sh" --epochs 80

    assert_success
    assert_output --partial "pod: continuing run ddp-train-b4t9z in ${BATS_TEST_TMPDIR}/runs/ddp-train-b4t9z (DDP_RESUME_RUN)"
    run grep '^ddp-launch' "${CALLS}"
    assert_output "ddp-launch preflight --site rcp --data-dir ${BATS_TEST_TMPDIR}/data --run-dir ${BATS_TEST_TMPDIR}/runs/ddp-train-b4t9z -- --mode kubeflow --site rcp --log-dir ${BATS_TEST_TMPDIR}/runs/ddp-train-b4t9z/logs -- --data-dir ${BATS_TEST_TMPDIR}/data --run-dir ${BATS_TEST_TMPDIR}/runs/ddp-train-b4t9z --resume --epochs 80"
    [ ! -e "${BATS_TEST_TMPDIR}/runs/ddp-train-x7k2q" ]

    : > "${CALLS}"
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/runs/ddp-train-x7k2q" \
        DDP_RESUME_RUN=../etc run bash "${REPO}/runai/pod.sh"
    assert_failure 2
    assert_output "pod: error: DDP_RESUME_RUN=../etc is not a run's name: give the name of the job that started the run (its directory under ${BATS_TEST_TMPDIR}/runs)"
    run grep -c '^ddp-launch' "${CALLS}"
    assert_output "0"
}

@test "pod: a run dir the pod's user cannot write is one line with the fix, exit 2, before ddp-launch" {
    _stage_data
    touch "${BATS_TEST_TMPDIR}/claim"  # not a directory: mkdir fails as it does on a claim of another uid
    DDP_DATA_DIR="${BATS_TEST_TMPDIR}/data" DDP_RUN_DIR="${BATS_TEST_TMPDIR}/claim/run" run bash "${REPO}/runai/pod.sh"

    assert_failure 2
    [ "${#lines[@]}" -eq 2 ]  # the pod's line, then the error
    # The pod's user is what `id` says (the stub's 224954:11259); the claim's owner is what stat reads.
    local owner
    owner="$(stat -c 'uid %u gid %g' "${BATS_TEST_TMPDIR}/claim")"
    assert_line --index 1 --regexp "^pod: error: cannot write the run dir ${BATS_TEST_TMPDIR}/claim/run \(mkdir: .*Not a directory\) as uid $(id -u) gid $(id -g): ${BATS_TEST_TMPDIR}/claim is ${owner}, mode [0-7]+; submit the pods as its owner \(RUNAI_RUN_AS=UID:GID runai/submit.sh, on RCP your ids from id on haas001.rcp.epfl.ch; a pod spec of your own: securityContext runAsUser and runAsGroup\) or make ${BATS_TEST_TMPDIR}/claim writable for uid $(id -u)$"
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
    assert_output --partial "pod: error: ${BATS_TEST_TMPDIR}/partial/cifar-100-python lacks test, meta: stage it on the claim once, where you submit from, with the same RUNAI_* settings: runai/submit.sh --download (one pod runs python3 -m ddp_contract download ${BATS_TEST_TMPDIR}/partial); a job of your own: that command in a pod of this image that mounts the claim; or set DDP_DATA_DIR to where it is"
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
