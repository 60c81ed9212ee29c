# shellcheck shell=bash disable=SC2034
# The plain-Ethernet cluster that slurm/ethernet-*.sh were written for, as
# tests/e2e/cluster/cluster.sh builds it (DDP_E2E_TWIN=ethernet): a head node master-node and
# node01-node05, Debian, each dual-homed: a default-route interface (eno1) on the site network and
# the cluster network on ens1f1, each on its own subnet, with one GPU a node.
#
# What this twin cannot reproduce:
# - GPUs: each node's GPU is a gres/gpu of one device file (/dev/nvidia0) that no driver answers,
#   so SLURM grants it and sets CUDA_VISIBLE_DEVICES, and the NCCL script runs CPU workers with gloo
#   (DDP_LAUNCH_CPU_WORKERS) over the same interface NCCL would take;
# - the site network beyond the gateway: eno1 reaches a bridge with the default route, nothing else.

# The cluster's host names, and the interface names of its per-rank case statement (ens1f1, the
# cluster network; eno1 the onboard NIC with the default route), which ddp-launch replaced.
TWIN_NODE_NAMES=(master-node node01 node02 node03 node04 node05)
TWIN_INTERFACE=ens1f1
TWIN_UPLINK=eno1
# Debian's installer maps each host's own name to 127.0.1.1 in /etc/hosts (Debian Reference,
# "The hostname resolution"), so master-node resolves itself to loopback.
TWIN_SELF_LOOPBACK=1
TWIN_NODE_SPEC="CPUs=32 RealMemory=128000 Gres=gpu:1"
TWIN_PARTITIONS=("batch Default=YES")
TWIN_GRES=("Name=gpu File=/dev/nvidia0 Flags=nvidia_gpu_env")
