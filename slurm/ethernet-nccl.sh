#!/bin/bash
#SBATCH --job-name=ddp-ethernet-nccl
#SBATCH --time=01:00:00
#SBATCH --nodes=6
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=1
#SBATCH --output=%x-%j.out
#SBATCH --signal=B:USR2@120
#SBATCH --requeue
#SBATCH --no-kill
#SBATCH --open-mode=append
# Plain-Ethernet cluster: N nodes x 1 GPU, NCCL over TCP sockets. InfiniBand is off
# (NCCL_IB_DISABLE=1) and the socket interface is chosen per node by ddp-launch from
# the route to the rendezvous host (the generic site profile), so nodes whose NICs
# have different names (ens1f1, ens1f0np0, ...) need no per-rank case statement.
# The Gloo variant on the same GPUs: sbatch slurm/ethernet-nccl.sh --backend gloo
# (gloo all-reduces the CUDA gradients over TCP on GLOO_SOCKET_IFNAME's interface).
# Submit from the repository root: sbatch [--nodes=N] slurm/ethernet-nccl.sh [trainer flags...]
# e.g. --epochs 5 (they follow DDP_TRAIN_ARGS and win); ddp-launch flags go in
# DDP_LAUNCH_ARGS="--max-restarts 2"; every DDP_* setting: slurm/lib/ddp.sh.
# Your own script in place of the trainer: sbatch ... slurm/ethernet-nccl.sh --script PATH [its arguments] (docs/own-script.md).
# shellcheck source-path=SCRIPTDIR source=lib/ddp.sh
source "${DDP_REPO:-${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}}/slurm/lib/ddp.sh" || { echo "error: submit from this project's checkout or set DDP_REPO" >&2; exit 2; }

ddp::default DDP_IMAGE "${DDP_REPO}/train-x86_64.sif"
ddp::default DDP_SITE generic
ddp::default DDP_TRAIN_NODES 6  # as #SBATCH --nodes; spares (DDP_SPARE_NODES) come on top
ddp::default DDP_DATA_DIR "${DDP_REPO}/data"
ddp::default DDP_RUN_DIR "${DDP_REPO}/runs/ethernet-nccl-%j"
ddp::trainer_defaults "--epochs 50 --batch-size 384 --base-lr 0.01"
ddp::default NCCL_IB_DISABLE 1

ddp::run_job node "$@"
