#!/bin/bash
#SBATCH --job-name=ddp-ethernet-gloo
#SBATCH --time=01:00:00
#SBATCH --nodes=6
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --output=%x-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
# Plain-Ethernet cluster, gloo: N nodes, CPU workers talking gloo over TCP, for nodes
# where NCCL is not usable (mixed or GPU-less nodes). The trainer picks gloo whenever
# it runs on CPU; the interface comes from the route to the rendezvous host.
# Submit from the repository root: sbatch [--nodes=N] slurm/ethernet-gloo.sh [trainer flags...]
# e.g. --epochs 5 (they follow DDP_TRAIN_ARGS and win); ddp-launch flags go in
# DDP_LAUNCH_ARGS="--max-restarts 2"; every DDP_* setting: slurm/lib/ddp.sh.
# Your own script in place of the trainer: sbatch ... slurm/ethernet-gloo.sh --script PATH [its arguments] (docs/own-script.md).
# shellcheck source-path=SCRIPTDIR source=lib/ddp.sh
source "${DDP_REPO:-${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}}/slurm/lib/ddp.sh" || { echo "error: submit from this project's checkout or set DDP_REPO" >&2; exit 2; }

ddp::default DDP_IMAGE "${DDP_REPO}/train-cpu.sif"
ddp::default DDP_SITE generic
ddp::default DDP_TRAIN_NODES 6  # as #SBATCH --nodes; spares (DDP_SPARE_NODES) come on top
ddp::default DDP_DATA_DIR "${DDP_REPO}/data"
ddp::default DDP_RUN_DIR "${DDP_REPO}/runs/ethernet-gloo-%j"
ddp::trainer_defaults "--epochs 10 --batch-size 384 --base-lr 0.01"
ddp::default DDP_CPU_WORKERS 1
ddp::default DDP_GPU 0

ddp::run_job node "$@"
