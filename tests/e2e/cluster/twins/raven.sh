# shellcheck shell=bash disable=SC2034
# Raven (MPCDF) as tests/e2e/cluster/cluster.sh builds it (DDP_E2E_TWIN=raven): the facts of its
# GPU nodes that slurm/raven-*.sh and ddp-launch meet. The files on its nodes (the InfiniBand HCAs
# in /sys/class/infiniband) are tests/e2e/twins.py's RAVEN; the image is the plain x86_64 one.
#
# What this twin cannot reproduce:
# - GPUs: a node's four A100 are a gres/gpu of four device files (/dev/nvidia0-3) that no driver
#   answers, so SLURM grants them and sets SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES as on Raven,
#   and each task trains on CPU with gloo (DDP_LAUNCH_CPU_WORKERS), as torch finds no CUDA device;
# - NCCL over InfiniBand: /sys/class/infiniband lists the HCAs, but no verbs device answers; ib0 is
#   a veth carrying IP, as IPoIB does;
# - the module system: apptainer is on PATH, as after Raven's `module load apptainer`.

# Raven's GPU nodes are ravgNNNN (MPCDF, the node names `sinfo -p gpu` lists).
TWIN_NODE_NAMES=(ravg1001 ravg1002 ravg1003)
# IP over InfiniBand: the HDR fabric's interface carries the nodes' IP traffic.
TWIN_INTERFACE=ib0
# A GPU node: 4 A100, 72 cores, 512 GB; GPU nodes are reached by the node feature gpu, through the
# gpu partition (github.com/mvigl/MPCDF_tutorial, docs/09_quotas_and_partitions.md; the Raven user
# guide's GPU scripts ask --constraint="gpu" and --gres=gpu:a100:N).
TWIN_NODE_SPEC="CPUs=72 RealMemory=512000 Features=gpu Gres=gpu:a100:4"
TWIN_PARTITIONS=("gpu Default=YES" "gpudev")
TWIN_GRES=("Name=gpu Type=a100 File=/dev/nvidia[0-3] Flags=nvidia_gpu_env")
