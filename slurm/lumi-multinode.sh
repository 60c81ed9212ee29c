#!/bin/bash
#SBATCH --job-name=ddp-lumi-multinode
#SBATCH --account=project_465000000
#SBATCH --partition=standard-g
#SBATCH --time=01:00:00
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=7
#SBATCH --mem-per-gpu=60G
#SBATCH --output=%x-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
# LUMI (CSC / EuroHPC), 2 or more LUMI-G nodes over Slingshot 11: one SLURM task per GCD, 8
# per node (an MI250X is two GCDs, and Slurm and HIP count each as a GPU:
# https://docs.lumi-supercomputer.eu/hardware/lumig/). No torchrun: each task is one rank
# (ddp-launch --mode slurm-task: RANK=SLURM_PROCID, LOCAL_RANK=SLURM_LOCALID, env:// init), as in
# the LUMI AI Guide's run_ddp_srun_4.sh (Lumi-supercomputer/LUMI-AI-Guide, 05-multi-gpu-and-node),
# which asks for these resources: standard-g, 8 GPUs and 8 tasks per node, 7 cores and 60 GB per GCD.
# One log file per rank: $DDP_RUN_DIR/logs/<job>-<node>-rank<N>.out; rank 0's streams into this output.
# The site profile (DDP_SITE=lumi) says the rest: the AMD accelerator (so Apptainer gets --rocm,
# chosen in slurm/lib/ddp.sh from the profile, never written here), the host binds, RCCL's env.
# LUMI's runtime is SingularityCE's `singularity`, part of the OS, with no `apptainer` command
# (https://docs.lumi-supercomputer.eu/software/containers/singularity/): DDP_CONTAINER_RUNTIME.
# Submit from the repository root, with your project: sbatch --account=project_NNNNNNNNN
#   slurm/lumi-multinode.sh [trainer flags...], e.g. --epochs 5 (they follow DDP_TRAIN_ARGS and win);
# ddp-launch flags go in DDP_LAUNCH_ARGS, e.g. DDP_LAUNCH_ARGS="--nccl-debug INFO" (RCCL's INFO lines in
# each rank's log); with no torchrun here, --max-restarts does nothing: a crash ends the job, and a new
# one on the same DDP_RUN_DIR resumes from its checkpoint. Every DDP_* setting: slurm/lib/ddp.sh.
# Your own script in place of the trainer: sbatch ... slurm/lumi-multinode.sh --script PATH [its arguments] (docs/own-script.md).
# shellcheck source-path=SCRIPTDIR source=lib/ddp.sh
source "${DDP_REPO:-${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}}/slurm/lib/ddp.sh" || { echo "error: submit from this project's checkout or set DDP_REPO" >&2; exit 2; }

ddp::default DDP_IMAGE "${DDP_REPO}/train-lumi-x86_64.sif"
ddp::default DDP_SITE lumi
ddp::default DDP_TRAIN_NODES 2  # as #SBATCH --nodes; spares (DDP_SPARE_NODES) come on top
ddp::default DDP_CONTAINER_RUNTIME singularity
ddp::default DDP_DATA_DIR "${DDP_REPO}/data"
ddp::default DDP_RUN_DIR "${DDP_REPO}/runs/lumi-multinode-%j"
# 32 images per GCD on 2 nodes, as per GPU in the Raven scripts.
ddp::trainer_defaults "--epochs 50 --batch-size 512 --base-lr 0.01"

# Each task on the cores nearest its GCD. A LUMI-G node's 64-core CPU has 8 CCDs of 8 cores, the
# first core of each reserved, so 7 per GCD; GCD i's nearest CCD is not CCD i (rocm-smi
# --showtoponuma). The masks, for local task i = GCD i, are LUMI's (the user guide's GPU binding,
# https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/distribution-binding/#gpu-binding, and
# the AI Guide's CPU_BIND_MASKS). srun reads SLURM_CPU_BIND as --cpu-bind (srun(1), INPUT
# ENVIRONMENT VARIABLES; LUMI's guide sets it the same way) and gives "the lowest task ID on each
# node ... the first mask" (srun(1), --cpu-bind mask_cpu), so the one-task-per-node steps (the
# preflight, the GPU sampler) run on GCD 0's CCD. verbose: srun logs each task's mask in the job's output.
LUMI_GCD_CPU_MASKS="0x00fe000000000000,0xfe00000000000000,0x0000000000fe0000,0x00000000fe000000"
LUMI_GCD_CPU_MASKS+=",0x00000000000000fe,0x000000000000fe00,0x000000fe00000000,0x0000fe0000000000"
readonly LUMI_GCD_CPU_MASKS
ddp::default SLURM_CPU_BIND "verbose,mask_cpu:${LUMI_GCD_CPU_MASKS}"

ddp::run_job task "$@"
