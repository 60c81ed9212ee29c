#!/usr/bin/env bats
# slurm/lumi-multinode.sh: LUMI-G's resources, one task per GCD, and the GCD-to-CCD CPU masks,
# with srun and friends stubbed (test_helper/common-setup.bash).

setup() {
    load 'test_helper/common-setup'
    _common_setup
    _job_env
    # srun as stubbed, also recording the CPU binding each step inherits (SLURM_CPU_BIND is
    # srun's --cpu-bind, srun(1) INPUT ENVIRONMENT VARIABLES).
    mv "${STUBS}/srun" "${STUBS}/srun-recorded"
    _stub_as srun srun-records-cpu-bind
    unset SLURM_CPU_BIND
}

# LUMI's masks, GCD 0 to 7 (https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/distribution-binding/#gpu-binding).
LUMI_MASKS="0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000,0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000"

@test "lumi: one task per GCD, slurm-task mode, the lumi site, one log file per rank" {
    run bash "${REPO}/slurm/lumi-multinode.sh" --epochs 3

    assert_success
    run _train_call
    # --rocm from containers/sites/lumi.json's accelerator (SingularityCE, like Apptainer, has
    # --rocm: Apptainer user guide, "GPU Support", https://apptainer.org/docs/user/main/gpu.html).
    assert_output --partial "srun --kill-on-bad-exit=0 --wait=30 --network=disable_rdzv_get --output=${DDP_RUN_DIR}/logs/%j-%N-rank%t.out singularity run --rocm ${DDP_IMAGE} "
    assert_output --partial " ${DDP_IMAGE} --site lumi --mode slurm-task -- --data-dir ${DDP_DATA_DIR} --run-dir ${DDP_RUN_DIR} --epochs 50 --batch-size 512 --base-lr 0.01 --epochs 3"
    run grep '^python3 -m ddp_launch.binds' "${CALLS}"
    assert_output "python3 -m ddp_launch.binds --site lumi --runtime singularity"
}

@test "lumi: SingularityCE runs the image, with the binds in SINGULARITY_BIND, the variable it reads" {
    # LUMI has singularity (SingularityCE) and no apptainer command
    # (https://docs.lumi-supercomputer.eu/software/containers/singularity/).
    rm "${STUBS}/apptainer"

    run bash "${REPO}/slurm/lumi-multinode.sh"

    assert_success
    run grep '^srun-env SINGULARITY_BIND=' "${CALLS}"
    assert_line "srun-env SINGULARITY_BIND=/host/lumi:/opt/lumi,${DDP_DATA_DIR}:${DDP_DATA_DIR},${DDP_RUN_DIR}:${DDP_RUN_DIR}"
    run grep -c -E '^srun .* apptainer ' "${CALLS}"
    assert_output "0"
}

@test "a user's SINGULARITY_BIND is kept first in the SINGULARITY_BIND that singularity steps get" {
    # SingularityCE reads SINGULARITY_BIND (SingularityCE user guide, "Bind Paths and Mounts",
    # https://docs.sylabs.io/guides/latest/user-guide/bind_paths_and_mounts.html); the generic site has no
    # host binds, so the real python3 -m ddp_launch.binds answers.
    export DDP_SITE=generic DDP_CONTAINER_RUNTIME=singularity SINGULARITY_BIND=/cluster/projects/x:/x,/scratch/me

    run bash "${REPO}/slurm/lumi-multinode.sh"

    assert_success
    run grep '^srun-env SINGULARITY_BIND=' "${CALLS}"
    assert_line "srun-env SINGULARITY_BIND=/cluster/projects/x:/x,/scratch/me,${DDP_DATA_DIR}:${DDP_DATA_DIR},${DDP_RUN_DIR}:${DDP_RUN_DIR}"
}

@test "with apptainer, a user's SINGULARITY_BIND, which Apptainer reads only while APPTAINER_BIND is unset, is kept in APPTAINER_BIND" {
    # Apptainer user guide, "Singularity Compatibility" (https://apptainer.org/docs/user/main/singularity_compatibility.html):
    # SINGULARITY_-prefixed variables count "when their respective APPTAINER_ ... counterparts are not set".
    export DDP_SITE=generic SINGULARITY_BIND=/cluster/projects/x:/x

    run bash "${REPO}/slurm/olivia-multinode.sh"

    assert_success
    run grep '^srun-env NCCL_IB_DISABLE' "${CALLS}"
    assert_line "srun-env NCCL_IB_DISABLE=unset APPTAINER_BIND=/cluster/projects/x:/x,${DDP_DATA_DIR}:${DDP_DATA_DIR},${DDP_RUN_DIR}:${DDP_RUN_DIR}"

    : > "${CALLS}"
    export APPTAINER_BIND=/work/mine  # set: Apptainer reads it alone, and so do the job's steps
    run bash "${REPO}/slurm/olivia-multinode.sh"
    assert_success
    run grep '^srun-env NCCL_IB_DISABLE' "${CALLS}"
    assert_line "srun-env NCCL_IB_DISABLE=unset APPTAINER_BIND=/work/mine,${DDP_DATA_DIR}:${DDP_DATA_DIR},${DDP_RUN_DIR}:${DDP_RUN_DIR}"
}

@test "lumi: the script leaves the GPU flag to ddp.sh and the site profile, never writing --rocm or --nv" {
    run grep -nE -- '--(rocm|nv)\b' "${REPO}/slurm/lumi-multinode.sh"
    refute_output --regexp '^[0-9]+:[^#]'
    run grep -c '^ddp::default DDP_SITE lumi$' "${REPO}/slurm/lumi-multinode.sh"
    assert_output 1
}

@test "lumi: standard-g, 8 GCDs and 8 tasks per node, 7 cores and 60 GB per GCD, an account in LUMI's form" {
    # The LUMI AI Guide's run_ddp_srun_4.sh (05-multi-gpu-and-node): the same resources per node.
    run grep -E '^#SBATCH --(account|partition|nodes|gpus-per-node|ntasks-per-node|cpus-per-task|mem-per-gpu)=' \
        "${REPO}/slurm/lumi-multinode.sh"
    assert_output "$(printf '%s\n' '#SBATCH --account=project_465000000' '#SBATCH --partition=standard-g' \
        '#SBATCH --nodes=2' '#SBATCH --gpus-per-node=8' '#SBATCH --ntasks-per-node=8' '#SBATCH --cpus-per-task=7' \
        '#SBATCH --mem-per-gpu=60G')"
}

@test "lumi: every step is bound with LUMI's GCD masks, verbose, through SLURM_CPU_BIND" {
    run bash "${REPO}/slurm/lumi-multinode.sh"

    assert_success
    run grep '^srun-cpu-bind' "${CALLS}"
    # The sampler and the training step (the preflight and gate are fabric_gate.bats's).
    assert_line --index 0 "srun-cpu-bind verbose,mask_cpu:${LUMI_MASKS}"
    assert_line --index 1 "srun-cpu-bind verbose,mask_cpu:${LUMI_MASKS}"
    [ "${#lines[@]}" -eq 2 ]
}

@test "lumi: mask i is the 7 cores of the CCD nearest GCD i, which LUMI's map_cpu list names by its first free core" {
    # The same page's one-core-per-GCD binding, --cpu-bind=map_cpu:49,57,17,25,1,9,33,41: the
    # free cores of a CCD are that core and the 6 after it (core 0 of each CCD is reserved).
    local -a masks=() first=(49 57 17 25 1 9 33 41)
    IFS=, read -r -a masks <<< "${LUMI_MASKS}"
    [ "${#masks[@]}" -eq 8 ]
    local i all=0
    for i in "${!masks[@]}"; do
        [ "$((masks[i]))" -eq "$((0x7f << first[i]))" ] || { echo "GCD ${i}: ${masks[i]}"; false; }
        [ "$((all & masks[i]))" -eq 0 ]  # no core twice
        all=$((all | masks[i]))
    done
    # 56 cores in all, none of them a CCD's first core (0, 8, ..., 56): 7 per task, --cpus-per-task=7.
    # (Bash arithmetic is signed 64-bit: bit 63 makes `all` negative, but each bit still reads back.)
    [ "$((all & 0x0101010101010101))" -eq 0 ]
    local bit count=0
    for bit in $(seq 0 63); do
        count=$((count + ((all >> bit) & 1)))
    done
    [ "${count}" -eq 56 ]
}

@test "lumi: a CPU binding the user set (sbatch --export) wins over the script's masks" {
    SLURM_CPU_BIND=none run bash "${REPO}/slurm/lumi-multinode.sh"

    assert_success
    run grep -c '^srun-cpu-bind none$' "${CALLS}"
    assert_output 2
}

@test "lumi: the script's default image is what make build-lumi writes" {
    run grep -c '^ddp::default DDP_IMAGE "${DDP_REPO}/train-lumi-x86_64.sif"$' "${REPO}/slurm/lumi-multinode.sh"
    assert_output 1
    run grep -c '^LUMI_SIF *?= $(SIF_DIR)/train-lumi-x86_64.sif$' "${REPO}/Makefile"
    assert_output 1
}

@test "lumi: a missing image says it is built off LUMI and copied there, not to run make build-lumi on LUMI" {
    # LUMI disables fakeroot: "building containers on LUMI is, unfortunately, not in general possible"
    # (https://docs.lumi-supercomputer.eu/software/containers/singularity/); the README's LUMI-G quick start
    # builds the image elsewhere and copies it into the checkout.
    export DDP_IMAGE="${BATS_TEST_TMPDIR}/checkout/train-lumi-x86_64.sif"

    run bash "${REPO}/slurm/lumi-multinode.sh"

    assert_failure 2
    assert_output "ddp: error: image ${DDP_IMAGE} not found: LUMI allows no fakeroot, so the LUMI image is built elsewhere: run 'make build-lumi' in a checkout on a machine with Apptainer 1.3 or newer (containers/README.md) and copy train-lumi-x86_64.sif to ${BATS_TEST_TMPDIR}/checkout, or set DDP_IMAGE"
    run grep -c '^srun' "${CALLS}"
    assert_output "0"
}
