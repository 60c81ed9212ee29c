#!/bin/bash
#SBATCH --job-name=ddp-olivia-1node
#SBATCH --account=nn0000k
#SBATCH --partition=accel
#SBATCH --time=01:00:00
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=72
#SBATCH --mem=440G
#SBATCH --output=%x-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
# Olivia (Sigma2), one node with 4 GH200: torchrun with 4 workers on the node.
# Recipe: the improved one (--recipe improved, docs/benchmarks.md), not the Sigma2 guide's. Its LR
# follows the global batch (--lr-scaling batch) from the guide's train_ddp.py default of 0.01 at 512
# images: peak LR 0.02 at batch 1024. The guide's own 4-GPU run (PyTorchMultiGpu.html) is --recipe
# guide --batch-size 1024 --base-lr 0.04, its LR unscaled: sbatch slurm/olivia-1node-4gpu.sh --recipe guide --base-lr 0.04
# Submit from the repository root: sbatch slurm/olivia-1node-4gpu.sh [trainer flags...]
# e.g. --epochs 5 (they follow DDP_TRAIN_ARGS and win); ddp-launch flags go in
# DDP_LAUNCH_ARGS="--max-restarts 2"; every DDP_* setting: slurm/lib/ddp.sh.
# Your own script in place of the trainer: sbatch ... slurm/olivia-1node-4gpu.sh --script PATH [its arguments] (docs/own-script.md).
# shellcheck source-path=SCRIPTDIR source=lib/ddp.sh
source "${DDP_REPO:-${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}}/slurm/lib/ddp.sh" || { echo "error: submit from this project's checkout or set DDP_REPO" >&2; exit 2; }

ddp::default DDP_IMAGE "${DDP_REPO}/train-olivia-arm64.sif"
ddp::default DDP_SITE olivia
ddp::default DDP_TRAIN_NODES 1  # as #SBATCH --nodes; spares (DDP_SPARE_NODES) come on top
ddp::default DDP_DATA_DIR "${DDP_REPO}/data"
ddp::default DDP_RUN_DIR "${DDP_REPO}/runs/olivia-1node-%j"
ddp::trainer_defaults "--recipe improved --epochs 100 --batch-size 1024 --base-lr 0.01 --target-accuracy 0.95 --patience 2"

ddp::run_job node "$@"
