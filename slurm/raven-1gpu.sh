#!/bin/bash
#SBATCH --job-name=ddp-raven-1gpu
#SBATCH --constraint="gpu"
#SBATCH --time=01:00:00
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=18
#SBATCH --gres=gpu:a100:1
#SBATCH --mem=125000
#SBATCH --output=%x-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
# Raven (MPCDF), one A100: the single-GPU row of the scaling table (then raven-1node-4gpu.sh,
# then raven-task-per-gpu.sh on 2 nodes; 32 images per GPU in all three). A quarter of a
# node: 18 of its 72 cores and a quarter of its memory, so the node can be shared.
# One SLURM task per GPU, as on Raven's bigger jobs; its log: $DDP_RUN_DIR/logs/<job>-<node>-rank0.out,
# which streams into this job's output.
# GPU nodes are a node feature on Raven, not a partition: --constraint="gpu", as in the Raven user
# guide's GPU batch scripts (https://docs.mpcdf.mpg.de/doc/computing/raven-user-guide.html) and
# MPCDF's tutorial (github.com/mvigl/MPCDF_tutorial, docs/09_quotas_and_partitions.md).
# Submit from the repository root: sbatch slurm/raven-1gpu.sh [trainer flags...]
# e.g. --epochs 5 (they follow DDP_TRAIN_ARGS and win); ddp-launch flags go in DDP_LAUNCH_ARGS, e.g.
# DDP_LAUNCH_ARGS="--nccl-debug INFO" (NCCL's INFO lines in each rank's log); with no torchrun here,
# --max-restarts does nothing: a crash ends the job, and a new one on the same DDP_RUN_DIR resumes
# from its checkpoint. Every DDP_* setting: slurm/lib/ddp.sh.
# Your own script in place of the trainer: sbatch ... slurm/raven-1gpu.sh --script PATH [its arguments] (docs/own-script.md).
# shellcheck source-path=SCRIPTDIR source=lib/ddp.sh
source "${DDP_REPO:-${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}}/slurm/lib/ddp.sh" || { echo "error: submit from this project's checkout or set DDP_REPO" >&2; exit 2; }

ddp::default DDP_IMAGE "${DDP_REPO}/train-x86_64.sif"
ddp::default DDP_APPTAINER_MODULE apptainer  # MPCDF: Apptainer is a module on Raven
ddp::default DDP_SITE raven
ddp::default DDP_TRAIN_NODES 1  # as #SBATCH --nodes; spares (DDP_SPARE_NODES) come on top
ddp::default DDP_DATA_DIR "${DDP_REPO}/data"
ddp::default DDP_RUN_DIR "${DDP_REPO}/runs/raven-1gpu-%j"
ddp::trainer_defaults "--epochs 50 --batch-size 32 --base-lr 0.01"

ddp::run_job task "$@"
