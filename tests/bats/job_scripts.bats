#!/usr/bin/env bats
# The exact command lines the slurm/ job scripts build, with srun and friends stubbed.

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _job_env
}

@test "olivia multi-node: one srun of apptainer --nv with the olivia site, torchrun logs and trainer flags" {
    run bash "${REPO}/slurm/olivia-multinode.sh" --epochs 3

    assert_success
    run _train_call
    assert_output "srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get apptainer run --nv ${DDP_IMAGE} --site olivia --log-dir ${DDP_RUN_DIR}/logs/42 -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --recipe improved --epochs 100 --batch-size 2048 --base-lr 0.01 --target-accuracy 0.95 --patience 2 --epochs 3"
}

@test "olivia multi-node: binds come from the olivia site profile plus the data and run directories" {
    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run grep '^python3 -m ddp_launch' "${CALLS}"
    assert_output "python3 -m ddp_launch.binds --site olivia --runtime apptainer
python3 -m ddp_launch.accelerators --site olivia apptainer-flag
python3 -m ddp_launch.sites --site olivia srun-args"
    run grep '^srun-env' "${CALLS}"
    assert_line "srun-env NCCL_IB_DISABLE=unset APPTAINER_BIND=/host/olivia:/opt/olivia,${DDP_DATA_DIR}:${DDP_DATA_DIR},${DDP_RUN_DIR}:${DDP_RUN_DIR}"
}

@test "an AMD site's profile gives apptainer --rocm: the job script never names the GPU flag" {
    # Apptainer user guide, "GPU Support" (https://apptainer.org/docs/user/main/gpu.html):
    # --nv for NVIDIA, --rocm for AMD; containers/sites/lumi.json says "accelerator": "amd".
    DDP_SITE=lumi run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run _train_call
    assert_output --partial "apptainer run --rocm ${DDP_IMAGE} --site lumi "
    refute_output --partial "--nv"
}

@test "a site the vendor question cannot read stops the job in one line before any srun" {
    DDP_SITE=nosuchsite run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output --partial "unknown site 'nosuchsite'"
    run grep -c '^srun .* apptainer run' "${CALLS}"
    assert_output "0"
}

@test "a Slingshot site's steps get srun --network=disable_rdzv_get from its profile's srun_args, a site without none" {
    # HPE's FI_CXI_RDZV_PROTO=alt_read (containers/sites/fabrics/slingshot.json) needs it: "When running
    # with slurm, the flag --network=disable_rdzv_get is required and must be added to the srun
    # command" (HewlettPackard/shs-ccl-docs, ccl_env.sh).
    export DDP_PREFLIGHT=1 DDP_FABRIC_GATE=1
    run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_success
    run grep -c '^srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get apptainer ' "${CALLS}"
    assert_output "1"  # the training, whose ranks run the fabric gate first
    run grep -c -- '--network' "${CALLS}"
    assert_output "1"  # not the preflight's doctor, nor the sampler
    # The same value in those steps' environment, where ddp-launch reads it (FI_CXI_RDZV_PROTO=alt_read
    # only with the flag: libfabric's fi_cxi(7)); srun reads SLURM_NETWORK as --network (srun(1)).
    run grep -c '^srun-env SLURM_NETWORK=disable_rdzv_get$' "${CALLS}"
    assert_output "1"
    run grep -c '^srun-env SLURM_NETWORK=' "${CALLS}"
    assert_output "1"

    : > "${CALLS}"
    DDP_SITE=generic run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_success
    run grep -c -- '--network\|SLURM_NETWORK' "${CALLS}"
    assert_output "0"
}

@test "the srun options are the profile's data: a profile that names another gets that one" {
    local -r sites="${BATS_TEST_TMPDIR}/sites"
    cp -r "${REPO}/containers/sites" "${sites}"
    python3 -c 'import json, sys
path = sys.argv[1]
data = json.load(open(path))
data["srun_args"] = [{"value": "--network=single_node_vni", "source": "this test"}]
json.dump(data, open(path, "w"))' "${sites}/generic.json"

    DDP_SITES_DIR="${sites}" DDP_SITE=generic run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run _train_call
    assert_output --partial "srun --kill-on-bad-exit=0 --wait=30 --network=single_node_vni apptainer run --nv "
}

@test "olivia single GPU and one node: the same step with their own trainer defaults" {
    run bash "${REPO}/slurm/olivia-1gpu.sh"
    assert_success
    run _train_call
    assert_output --partial "--site olivia --log-dir ${DDP_RUN_DIR}/logs/42 -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --recipe improved --epochs 100 --batch-size 256 "

    : > "${CALLS}"
    run bash "${REPO}/slurm/olivia-1node-4gpu.sh"
    assert_success
    run _train_call
    assert_output --partial " --batch-size 1024 "
}

@test "every script starts one GPU sampler per node as an overlapping step" {
    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run grep 'gpu-sampler.sh' "${CALLS}"
    assert_output "srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=0 --output=${DDP_RUN_DIR}/gpu/sampler-%N.log ${REPO}/slurm/gpu-sampler.sh ${DDP_RUN_DIR}/gpu 5"
}

@test "a job of 2 nodes x 4 tasks (Raven, LUMI) still runs one sampler and one doctor per node" {
    # The steps inherit SLURM_NTASKS=8 from the job, "Same as -n, --ntasks", and srun gives --ntasks
    # precedence over --ntasks-per-node (srun(1)): by that rule, without --ntasks each node runs 4
    # samplers into one gpu-<node>.csv. The stub counts a step's tasks by it ($STEP_TASKS). Slurm
    # 22.05 (the e2e cluster) lets the command line's --ntasks-per-node win instead; a step that names
    # both is the same under either.
    export SLURM_NTASKS=8 DDP_PREFLIGHT=1

    run bash "${REPO}/slurm/raven-task-per-gpu.sh"

    assert_success
    run grep -E ' (apptainer|.*/gpu-sampler\.sh)$' "${STEP_TASKS}"
    assert_output "$(printf '%s\n' '2 apptainer' "2 ${REPO}/slurm/gpu-sampler.sh" '8 apptainer')"
}

@test "raven: one task per GPU, slurm-task mode, one log file per rank named by node" {
    run bash "${REPO}/slurm/raven-task-per-gpu.sh"

    assert_success
    run _train_call
    assert_output "srun --kill-on-bad-exit=0 --wait=30 --output=${DDP_RUN_DIR}/logs/%j-%N-rank%t.out apptainer run --nv ${DDP_IMAGE} --site raven --mode slurm-task -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --epochs 50 --batch-size 256 --base-lr 0.01"
}

@test "raven single GPU and one node: the same task-per-GPU step, 32 images per GPU as on 2 nodes" {
    run bash "${REPO}/slurm/raven-1gpu.sh"
    assert_success
    run _train_call
    assert_output "srun --kill-on-bad-exit=0 --wait=30 --output=${DDP_RUN_DIR}/logs/%j-%N-rank%t.out apptainer run --nv ${DDP_IMAGE} --site raven --mode slurm-task -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --epochs 50 --batch-size 32 --base-lr 0.01"

    : > "${CALLS}"
    run bash "${REPO}/slurm/raven-1node-4gpu.sh"
    assert_success
    run _train_call
    assert_output --partial "--site raven --mode slurm-task -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --epochs 50 --batch-size 128 "
}

@test "raven's three scripts ask SLURM for 1, 4 and 2x4 A100s, one task and 18 cores per GPU" {
    # MPCDF Raven: 4 A100 and 72 cores per GPU node, GPUs requested as --gres=gpu:a100:N
    # (the Raven user guide's example GPU job scripts, https://docs.mpcdf.mpg.de/doc/computing/raven-user-guide.html).
    local script
    for script in raven-1gpu:1:1 raven-1node-4gpu:1:4 raven-task-per-gpu:2:4; do
        IFS=: read -r name nodes gpus <<< "${script}"
        run grep -E '^#SBATCH --(nodes|ntasks-per-node|gres|cpus-per-task)=' "${REPO}/slurm/${name}.sh"
        assert_output "$(printf '%s\n' "#SBATCH --nodes=${nodes}" "#SBATCH --ntasks-per-node=${gpus}" \
            "#SBATCH --cpus-per-task=18" "#SBATCH --gres=gpu:a100:${gpus}")"
    done
}

@test "raven's scripts select GPU nodes by the node feature gpu, not a partition" {
    # Raven's GPU nodes are a constraint: --constraint="gpu" (the Raven user guide's GPU batch scripts,
    # https://docs.mpcdf.mpg.de/doc/computing/raven-user-guide.html; MPCDF's tutorial,
    # mvigl/MPCDF_tutorial docs/09_quotas_and_partitions.md: "accessed via constraints rather than
    # named partitions"). sbatch reads the quotes as the shell does, so the value is gpu.
    local script
    for script in "${REPO}"/slurm/raven-*.sh; do
        run grep -E '^#SBATCH --(constraint|partition)[= ]' "${script}"
        assert_output '#SBATCH --constraint="gpu"'
    done
}

@test "every script SLURM may requeue appends to its .out, so a requeued run keeps the first run's lines" {
    # A requeued batch job reopens its --output file; SLURM truncates it unless the job asks for
    # --open-mode=append (sbatch(1) --open-mode; the default is slurm.conf(5) JobFileAppend=0).
    local script count=0
    for script in "${REPO}"/slurm/*.sh; do
        grep -q '^#SBATCH --requeue$' "${script}" || continue
        count=$((count + 1))
        run grep -c '^#SBATCH --open-mode=append$' "${script}"
        assert_output 1
    done
    [ "${count}" -ge 8 ]
}

@test "raven task mode: rank 0's log streams into the job output while the step runs, every line" {
    # srun --output=...%t gives each task its own file (srun(1), "filename pattern"), so
    # the job's .out shows only what the batch script copies there. This srun writes
    # rank 0's file, then waits for its first line to reach the job's output before it
    # ends: without streaming it gives up after 20 s and fails the step.
    local -r job_out="${BATS_TEST_TMPDIR}/job.out"
    export JOB_OUT="${job_out}"
    _stub_as srun srun-streams-rank0

    bash "${REPO}/slurm/raven-task-per-gpu.sh" > "${job_out}" 2>&1 || { cat "${job_out}"; false; }

    run cat "${job_out}"
    assert_line "Epoch 1/50: step 30/196 (15%)"
    assert_line "line 1"   # all of it, not the last 25 lines
    assert_line "line 40"
    refute_output --partial "did not stream"
    # Rank 0's node is the batch script's own (SLURMD_NODENAME), not asked of scontrol.
    run grep -c '^scontrol' "${CALLS}"
    assert_output "0"
}

@test "ethernet nccl: InfiniBand disabled, generic site, one torchrun per node" {
    run bash "${REPO}/slurm/ethernet-nccl.sh"

    assert_success
    run grep '^srun-env' "${CALLS}"
    assert_line --partial "srun-env NCCL_IB_DISABLE=1 "
    run _train_call
    assert_output --partial "apptainer run --nv ${DDP_IMAGE} --site generic --log-dir "
}

@test "ethernet gloo: CPU workers and no --nv" {
    run bash "${REPO}/slurm/ethernet-gloo.sh"

    assert_success
    run _train_call
    assert_output "srun --kill-on-bad-exit=0 --wait=30 apptainer run ${DDP_IMAGE} --site generic --cpu-workers 1 --log-dir ${DDP_RUN_DIR}/logs/42 -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --epochs 10 --batch-size 384 --base-lr 0.01"
}

@test "settings from the environment (sbatch --export) win over the script's defaults" {
    export DDP_TRAIN_ARGS="--epochs 1 --width-scale 0.5" DDP_SITE=generic DDP_LAUNCH_ARGS="--max-restarts 2"

    run bash "${REPO}/slurm/olivia-multinode.sh" --seed 7

    assert_success
    run _train_call
    assert_output "srun --kill-on-bad-exit=0 --wait=30 apptainer run --nv ${DDP_IMAGE} --site generic --log-dir ${DDP_RUN_DIR}/logs/42 --max-restarts 2 -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --epochs 1 --width-scale 0.5 --seed 7"
}

@test "trainer arguments after the script name reach the trainer byte for byte" {
    run bash "${REPO}/slurm/olivia-multinode.sh" --note 'two words' '$HOME' '*'

    assert_success
    run tail -n 5 "${STEP_ARGV}"
    assert_output "$(printf '%s\n' --patience 2 --note 'two words' '$HOME' '*' | tail -n 5)"
    run _train_call
    assert_output --partial " --patience 2 --note two words \$HOME *"
}

@test "DDP_TRAIN_ARGS is split with the shell's quoting: a quoted argument with spaces stays one word" {
    export DDP_TRAIN_ARGS="--note 'two words' --tag \"\$HOME\" --glob '*'" DDP_LAUNCH_ARGS="--nccl-debug 'INFO'"

    run bash "${REPO}/slurm/olivia-multinode.sh" --seed 7

    assert_success
    run tail -n 8 "${STEP_ARGV}"
    assert_output "$(printf '%s\n' --note 'two words' --tag '$HOME' --glob '*' --seed 7)"
    run grep -x -A 1 -- --nccl-debug "${STEP_ARGV}"
    assert_output "$(printf '%s\n' --nccl-debug INFO)"
}

@test "DDP_TRAIN_ARGS with an unclosed quote stops the job in one line before any srun" {
    export DDP_TRAIN_ARGS="--note 'unclosed"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output "ddp: error: DDP_TRAIN_ARGS=\"--note 'unclosed\" is not words of the shell (No closing quotation): close each quote as in the shell, e.g. \"a b\""
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "missing data stops the job before any step, naming the directory and make data" {
    rm "${DDP_DATA_DIR}/cifar-100-python/test"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output "ddp: error: ${DDP_DATA_DIR}/cifar-100-python lacks test: run 'make data DATA_DIR=${DDP_DATA_DIR}' on the login node, or set DDP_DATA_DIR"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "a run dir another live job holds stops the job in one line, exit 2, before any srun or write" {
    # What the trainer's rank 0 writes there while it runs (ddp_contract/rundir_lock.py);
    # this shell's pid is alive, and the file is fresh.
    mkdir -p "${DDP_RUN_DIR}"
    printf '{"job": "41", "host": "othernode", "pid": %d}' "$$" > "${DDP_RUN_DIR}/.ddp-run.lock"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output --regexp "^ddp: error: --run-dir ${DDP_RUN_DIR} is in use by job 41 on othernode \\(pid $$, alive [0-9]+ s ago\\): give this job another run dir"
    assert_equal "$(echo "${output}" | wc -l)" 1
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
    assert_equal "$(ls -A "${DDP_RUN_DIR}")" ".ddp-run.lock"
}

@test "a run dir whose checkpoint the flags cannot resume stops the job in one line, exit 2, before any srun" {
    # The checkpoint's summary, as the trainer writes it beside checkpoint.pt (ddp_contract.same_run): a
    # run of 100 epochs at olivia-multinode.sh's own flags. A resume may train longer, never shorter.
    mkdir -p "${DDP_RUN_DIR}"
    printf '{"config": {"width_scale": 1.0, "batch_size": 2048, "seed": 0, "recipe": "improved", "epochs": 100}}' \
        > "${DDP_RUN_DIR}/checkpoint.json"

    run bash "${REPO}/slurm/olivia-multinode.sh" --epochs 3

    assert_failure 2
    assert_output "ddp: error: ${DDP_RUN_DIR}/checkpoint.pt is a run of --epochs 100, this run has 3: a resume may train longer, never shorter (the steps taken were scheduled for 100 epochs); pass --epochs 100 or more, another DDP_RUN_DIR, or --no-resume (which keeps this run, moved aside into ${DDP_RUN_DIR}/checkpoint-<UTC time>/)"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"

    run bash "${REPO}/slurm/olivia-multinode.sh" --epochs 150
    assert_success
    run bash "${REPO}/slurm/olivia-multinode.sh" --epochs 3 --no-resume
    assert_success
}

@test "a lock left by this same job (a requeue) does not stop it" {
    mkdir -p "${DDP_RUN_DIR}"
    printf '{"job": "42", "host": "othernode", "pid": %d}' "$$" > "${DDP_RUN_DIR}/.ddp-run.lock"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run grep -c '^srun' "${CALLS}"
    refute_output "0"
}

@test "a missing image stops the job with the path and how to build it" {
    rm "${DDP_IMAGE}"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output "ddp: error: image ${DDP_IMAGE} not found: build it in the checkout (make build-olivia, build-lumi, build-x86 or build-cpu, whichever fits the site; containers/README.md) or set DDP_IMAGE"
}

@test "each script's missing image names the make target that builds it, as the Makefile says" {
    local script image target count=0
    for script in "${REPO}"/slurm/*.sh; do
        image="$(sed -n 's|^ddp::default DDP_IMAGE "${DDP_REPO}/\(.*\)"$|\1|p' "${script}")"
        [ -n "${image}" ] || continue  # not a job script (gpu-sampler.sh)
        # The target whose recipe writes that file (make -n prints it, runs nothing).
        target=""
        for candidate in build-olivia build-lumi build-x86 build-cpu; do
            if make -n -C "${REPO}" "${candidate}" SIF_DIR=/sifdir 2>/dev/null | grep -q "/sifdir/${image}\b"; then
                target="${candidate}"
            fi
        done
        [ -n "${target}" ] || { echo "no make target builds ${image}"; false; }
        # The script's image under its own name, where none was built (the checkout may hold one).
        DDP_IMAGE="${BATS_TEST_TMPDIR}/sifs/${image}" run bash "${script}"
        assert_failure 2
        if [ "${target}" = build-lumi ]; then  # built off LUMI: lumi.bats
            assert_output --partial "run 'make build-lumi' in a checkout on a machine with Apptainer 1.3 or newer"
        else
            assert_output "ddp: error: image ${BATS_TEST_TMPDIR}/sifs/${image} not found: build it in the checkout (make ${target} SIF_DIR=${BATS_TEST_TMPDIR}/sifs; containers/README.md) or set DDP_IMAGE"
        fi
        count=$((count + 1))
    done
    [ "${count}" -eq 9 ]
}

@test "an image elsewhere than the checkout is built there with SIF_DIR" {
    export DDP_IMAGE="${BATS_TEST_TMPDIR}/sifs/train-x86_64.sif"

    run bash "${REPO}/slurm/raven-task-per-gpu.sh"

    assert_failure 2
    assert_output "ddp: error: image ${DDP_IMAGE} not found: build it in the checkout (make build-x86 SIF_DIR=${BATS_TEST_TMPDIR}/sifs; containers/README.md) or set DDP_IMAGE"
}

@test "a checkout that is not this project is refused" {
    export DDP_REPO="${BATS_TEST_TMPDIR}"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_line --partial "${BATS_TEST_TMPDIR}/slurm/lib/ddp.sh: No such file or directory"
    assert_line "error: submit from this project's checkout or set DDP_REPO"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "a step that stopped on a signal with a checkpoint (exit 75) requeues the job" {
    export SRUN_STATUS=75 SLURM_RESTART_COUNT=1

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "requeuing job 42 (restart 2 of 3)"
    run grep '^scontrol requeue' "${CALLS}"
    assert_output "scontrol requeue 42"
}

# A requeued job numbers its steps from 0 again (slurmctld's batch_requeue_fini resets next_step_id),
# and a signal slurmctld could not deliver to an unreachable node is retried every 60 s naming only
# the job and step id (src/slurmctld/agent.c): it would kill the requeued run's step of that id.
@test "every run records in its run dir how many step ids the job has taken, before each step" {
    export DDP_PREFLIGHT=1 DDP_FABRIC_GATE=1

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    # preflight, GPU sampler, training (its ranks run the fabric gate first): SLURM's ids 0 to 2.
    run cat "${DDP_RUN_DIR}/.ddp-step-ids"
    assert_output "42 3"
    assert_equal "$(cat "${BATS_TEST_TMPDIR}/next-step-id")" 3
    run grep -c 'printenv SLURM_STEP_ID' "${CALLS}"
    assert_output "0"
}

@test "a requeued run uses up the step ids its predecessors took before its first real step" {
    export SLURM_RESTART_COUNT=1
    mkdir -p "${DDP_RUN_DIR}"
    echo "42 4" > "${DDP_RUN_DIR}/.ddp-step-ids"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "restart 1: skipped step ids 0-3, which this job's earlier runs used"
    # Four steps that only print their id, then the sampler and the training step as ids 4 and 5.
    run grep '^srun ' "${CALLS}"
    assert_line --index 0 'srun --overlap --nodes=1 --ntasks=1 --kill-on-bad-exit=0 printenv SLURM_STEP_ID'
    assert_equal "$(grep -c 'printenv SLURM_STEP_ID' "${CALLS}")" 4
    assert_line --index 4 --partial 'gpu-sampler.sh'
    run cat "${DDP_RUN_DIR}/.ddp-step-ids"
    assert_output "42 6"
}

@test "a step SLURM refuses to create takes no id, so the skipping goes on until the ids are used up" {
    export SLURM_RESTART_COUNT=2 SRUN_REFUSE_STEPS=2
    mkdir -p "${DDP_RUN_DIR}"
    echo "42 3" > "${DDP_RUN_DIR}/.ddp-step-ids"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_equal "$(grep -c 'printenv SLURM_STEP_ID' "${CALLS}")" 5
    run cat "${DDP_RUN_DIR}/.ddp-step-ids"
    assert_output "42 5"
}

@test "step ids recorded by another job in the same run dir are not skipped" {
    mkdir -p "${DDP_RUN_DIR}"
    echo "41 9" > "${DDP_RUN_DIR}/.ddp-step-ids"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run grep -c 'printenv SLURM_STEP_ID' "${CALLS}"
    assert_output "0"
    run cat "${DDP_RUN_DIR}/.ddp-step-ids"
    assert_output "42 2"
}

@test "USR2 to the batch shell (--signal=B:USR2) asks the running training step to stop through the run dir; the job requeues" {
    # sbatch(1) --signal "B:": SLURM signals the batch shell alone, and bash runs a trap only
    # between commands (bash(1), SIGNALS), so the script must wait for the step in the background.
    export SRUN_WAITS_FOR_STOP=1 SLURM_RESTART_COUNT=0
    mkdir -p "${DDP_RUN_DIR}"
    bash "${REPO}/slurm/olivia-multinode.sh" > "${BATS_TEST_TMPDIR}/job.out" 2>&1 &
    local -r job=$!
    # The trap is set once the step runs: under a load of 18 the script took over the 10 s this
    # waited before, and the USR2 then ended a shell without its trap. A minute, then say so.
    for _ in $(seq 600); do
        [ -e "${DDP_RUN_DIR}/.step-waiting" ] && break
        sleep 0.1
    done
    [ -e "${DDP_RUN_DIR}/.step-waiting" ] || fail "the training step did not start within 60 s"
    kill -USR2 "${job}"
    local status=0
    wait "${job}" || status=$?

    run cat "${BATS_TEST_TMPDIR}/job.out"
    assert_equal "${status}" 0
    assert_output --partial "SIGUSR2 reached the batch script: asked the training step to checkpoint and stop (${DDP_RUN_DIR}/.ddp-stop-request)"
    assert_output --partial "requeuing job 42 (restart 1 of 3)"
    run grep '^stop-request' "${CALLS}"
    assert_output "stop-request SIGUSR2"
}

@test "a stop request left in the run dir by an earlier run is removed before the training starts" {
    mkdir -p "${DDP_RUN_DIR}"
    echo SIGUSR2 > "${DDP_RUN_DIR}/.ddp-stop-request"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run grep -c '^stop-request-at-start' "${CALLS}"
    assert_output "0"
}

@test "the stop request's file name is the trainer's (ddp_contract.STOP_REQUEST_FILE)" {
    # The host's python3, with the package from this checkout as the job scripts give it (PYTHONPATH).
    PYTHONPATH="${REPO}/entrypoints" run python3 -c 'import ddp_contract; print(ddp_contract.STOP_REQUEST_FILE)'
    assert_success
    local trainers="${output}"
    # What the job scripts see once they source the library, not how the line is spelled.
    run env -i PATH="${PATH}" bash -c 'source "$1" && printf "%s\n" "${DDP_STOP_REQUEST_FILE}"' _ "${REPO}/slurm/lib/ddp.sh"
    assert_success
    assert_output "${trainers}"
}

# A job array's tasks: each has its own SLURM_JOB_ID, the first task's equal to SLURM_ARRAY_JOB_ID, and
# scontrol given that id acts on every task (Lightning-AI/pytorch-lightning#15022); <array>_<task> names
# one (https://slurm.schedmd.com/job_array.html). Task 0 of array 42 here.
_array_task() {
    export SLURM_JOB_ID="$1" SLURM_ARRAY_JOB_ID="$2" SLURM_ARRAY_TASK_ID="$3"
    export DDP_RUN_DIR="${BATS_TEST_TMPDIR}/sweep-%A_%a"
}

@test "a stop in a job array requeues that task alone: scontrol requeue <array>_<task>" {
    _array_task 42 42 0
    export SRUN_STATUS=75

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    assert_output --partial "requeuing job 42_0 (restart 1 of 3)"
    run grep '^scontrol' "${CALLS}"
    assert_output "scontrol requeue 42_0"
}

@test "a bad node in a job array: that task alone is held, given ExcNodeList and released" {
    _array_task 43 42 1
    export DDP_PREFLIGHT=1 DOCTOR_FAILS=node2 PARTITION_NODES="node1 node2 node3"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 76
    run grep '^scontrol \(update\|requeue\|release\)' "${CALLS}"
    assert_output "scontrol requeuehold 42_1
scontrol update JobId=42_1 ExcNodeList=node2
scontrol release 42_1"
}

@test "DDP_RUN_DIR names the array task as sbatch --output does (%A_%a), one run dir per task" {
    _array_task 44 42 2

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run _train_call
    assert_output --partial " -- --data-dir ${DDP_DATA_DIR} --run-dir ${BATS_TEST_TMPDIR}/sweep-42_2 "
    [ -d "${BATS_TEST_TMPDIR}/sweep-42_2" ]

    : > "${CALLS}"
    DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run-%j" run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_success
    run _train_call
    assert_output --partial " --run-dir ${BATS_TEST_TMPDIR}/run-44 "
}

@test "every script's default run dir is the job's own (%j), so each task of an array gets one" {
    local script count=0
    for script in "${REPO}"/slurm/*.sh; do
        grep -q '^ddp::run_job ' "${script}" || continue
        count=$((count + 1))
        run grep '^ddp::default DDP_RUN_DIR ' "${script}"
        assert_output --regexp '^ddp::default DDP_RUN_DIR "\$\{DDP_REPO\}/runs/[a-z0-9-]+-%j"$'
    done
    [ "${count}" -ge 9 ]
}

@test "a run dir every task of an array would share, or a pattern the scripts do not fill in, is one line, exit 2" {
    _array_task 43 42 1
    DDP_RUN_DIR="${BATS_TEST_TMPDIR}/sweep" run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 2
    assert_output "ddp: error: DDP_RUN_DIR=${BATS_TEST_TMPDIR}/sweep is the same directory for every task of job array 42: name the task in it with %a (DDP_RUN_DIR='runs/sweep-%A_%a'), so each task trains its own run"

    unset SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID
    DDP_RUN_DIR="${BATS_TEST_TMPDIR}/sweep-%a" run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 2
    assert_output "ddp: error: DDP_RUN_DIR=${BATS_TEST_TMPDIR}/sweep-%a names an array task (%a), but job 43 is not a job array: submit it with sbatch --array=..., or leave %a out"

    DDP_RUN_DIR="${BATS_TEST_TMPDIR}/run-%x" run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 2
    assert_output --partial "'%x' is not a pattern the job scripts fill in: use %j (the job), %A (the array job), %a (the array task) or %% (a '%')"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "only exit 75 requeues: exit 1 is a failure even when the metrics say stopped" {
    export SRUN_STATUS=1
    mkdir -p "${DDP_RUN_DIR}"
    printf '{"type": "epoch", "epoch": 0}\n{"type": "stopped", "signal": "SIGUSR2", "exit_code": 75}\n' \
        > "${DDP_RUN_DIR}/metrics.jsonl"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 1
    run grep -c '^scontrol' "${CALLS}"
    assert_output "0"
}

@test "requeues stop at DDP_MAX_REQUEUES and the job keeps the step's exit status" {
    export SRUN_STATUS=75 SLURM_RESTART_COUNT=3

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 75
    assert_output --partial "already requeued 3 times (DDP_MAX_REQUEUES=3): not requeuing"
    run grep -c '^scontrol' "${CALLS}"
    assert_output "0"
}

@test "a failed step is not requeued and its status is the job's" {
    export SRUN_STATUS=1

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 1
    assert_output --partial "job failed with exit status 1; per-rank logs are in ${DDP_RUN_DIR}/logs"
    run grep -c '^scontrol' "${CALLS}"
    assert_output "0"
}

@test "a step killed by SIGBUS (135) or SIGKILL (137) says why in the job's last line" {
    # srun's code for a task killed by signal N is 128 + N. SIGBUS: the image's squashfuse mount went
    # (docs/troubleshooting.md); SIGKILL: srun --wait ended a task that outlived the first one, or the
    # OOM killer took a launcher.
    export SRUN_STATUS=135
    run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 135
    assert_line --partial "ddp: job failed with exit status 135 (128 + SIGBUS: the image went away under the tasks: unprivileged Apptainer serves it through a squashfuse_ll process"
    assert_line --partial "export APPTAINER_UNSQUASH=1 before sbatch"

    export SRUN_STATUS=137 DDP_STEP_WAIT=45
    run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_failure 137
    assert_line --partial "ddp: job failed with exit status 137 (128 + SIGKILL: a task was killed: srun ends the tasks still running DDP_STEP_WAIT=45 s after the first one ended, a hung rank among them, or the OOM killer"
    # Both name the page that says more, under a heading it has.
    run grep -c '^## Exit 135 or 137$' "${REPO}/docs/troubleshooting.md"
    assert_output "1"
}

@test "apptainer missing from PATH stops the job in one line naming the module, before any srun" {
    rm "${STUBS}/apptainer"
    export PATH="${STUBS}:/usr/bin:/bin"

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output --partial "apptainer is not on PATH: run 'module load apptainer'"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "DDP_CONTAINER_RUNTIME=singularity runs singularity, binds in SINGULARITY_BIND; a runtime it does not know is one line" {
    export DDP_CONTAINER_RUNTIME=singularity

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run _train_call
    assert_output --partial "srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get singularity run --nv ${DDP_IMAGE} --site olivia "
    run grep '^srun-env' "${CALLS}"
    assert_line "srun-env NCCL_IB_DISABLE=unset APPTAINER_BIND=unset"
    assert_line "srun-env SINGULARITY_BIND=/host/olivia:/opt/olivia,${DDP_DATA_DIR}:${DDP_DATA_DIR},${DDP_RUN_DIR}:${DDP_RUN_DIR}"

    : > "${CALLS}"
    DDP_CONTAINER_RUNTIME=podman run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output "ddp: error: DDP_CONTAINER_RUNTIME=podman is not a runtime the job scripts run: use apptainer or singularity (SingularityCE)"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "singularity missing from PATH stops the job in one line naming it, before any srun" {
    rm "${STUBS}/singularity"
    export PATH="${STUBS}:/usr/bin:/bin" DDP_CONTAINER_RUNTIME=singularity

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_failure 2
    assert_output --partial "singularity is not on PATH: run 'module load singularity'"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}

@test "raven loads its apptainer module when apptainer is not on PATH" {
    rm "${STUBS}/apptainer"
    export PATH="${STUBS}:/usr/bin:/bin"
    # Lmod's `module` is a shell function that job scripts inherit from the environment.
    module() {
        printf 'module %s\n' "$*" >> "${CALLS}"
        cp "${REPO}/tests/bats/stubs/apptainer-of-module" "${STUBS}/apptainer"
    }
    export -f module

    run bash "${REPO}/slurm/raven-task-per-gpu.sh"

    assert_success
    run grep '^module' "${CALLS}"
    assert_output "module load apptainer"
    run grep -c '^srun .* apptainer run' "${CALLS}"
    assert_output "1"
}

@test "relative data and run directories are made absolute for the binds and the trainer" {
    cd "${BATS_TEST_TMPDIR}"
    export DDP_DATA_DIR=data DDP_RUN_DIR=runs/one

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run grep '^srun-env' "${CALLS}"
    assert_line --partial ",${BATS_TEST_TMPDIR}/data:${BATS_TEST_TMPDIR}/data,${BATS_TEST_TMPDIR}/runs/one:${BATS_TEST_TMPDIR}/runs/one"
    run _train_call
    assert_output --partial " -- --data-dir ${BATS_TEST_TMPDIR}/data --run-dir ${BATS_TEST_TMPDIR}/runs/one "
}

@test "a run or data directory with ',' or ':' is refused in one line before any srun" {
    for bad in "${BATS_TEST_TMPDIR}/run,2" "${BATS_TEST_TMPDIR}/run:2"; do
        : > "${CALLS}"
        DDP_RUN_DIR="${bad}" run bash "${REPO}/slurm/olivia-multinode.sh"

        assert_failure 2
        assert_output "ddp: error: DDP_RUN_DIR=${bad} contains ',' or ':', which APPTAINER_BIND cannot carry: use a path without them (a symlink to it works)"
        run grep -c '^srun' "${CALLS}"
        assert_output "0"
    done
}
