# shellcheck shell=bash disable=SC2034
# Olivia (Sigma2 / NRIS) as tests/e2e/cluster/cluster.sh builds it (DDP_E2E_TWIN=olivia): the facts of
# its GPU nodes that slurm/olivia-*.sh and ddp-launch meet. The files on its nodes (the host
# libfabric, NCCL and OFI plugin, libcxi, /dev/cxi0) are tests/e2e/twins.py's OLIVIA.
#
# What this twin cannot reproduce:
# - GPUs: a node's four GH200 are a gres/gpu of four device files (/dev/nvidia0-3) that no driver
#   answers, so SLURM grants them and sets SLURM_GPUS_ON_NODE and CUDA_VISIBLE_DEVICES as on Olivia,
#   and the jobs run CPU workers with gloo (DDP_LAUNCH_CPU_WORKERS), as torch finds no CUDA device;
# - NCCL over Slingshot: the bound libfabric, libcxi and OFI plugin are real ELF files with the real
#   names and links, but stand-ins that talk to no NIC; hsn0 is a veth;
# - the arm64 image: the jobs run gpu.def built for x86_64 on the test base instead of NGC's arm64
#   one (the scripts pass --site olivia, which wins over the image's SITE default); make
#   build-olivia's arm64 build is tested apart, in tests/e2e/test_make_build.py.

# HPE Cray EX names its compute nodes nid and six digits (HPE Cray System Management documentation,
# Cray-HPE/docs-csm, customer-accessible networks: "nid000001.chn.tld").
TWIN_NODE_NAMES=(nid001000 nid001001 nid001002)
# The Slingshot NIC's interface, over which NCCL bootstraps (Olivia's NCCL module and HPE's
# shs-ccl-docs ccl_env.sh: NCCL_SOCKET_IFNAME=hsn0,...; the site profile's NCCL_SOCKET_IFNAME).
TWIN_INTERFACE=hsn0
# An accel node: four GH200, 72 Grace cores and 120 GB each (Sigma2 documentation,
# hpc_machines/olivia); the scripts ask for all four with 72 cores per task and --mem=440G.
TWIN_NODE_SPEC="CPUs=288 RealMemory=460800 Gres=gpu:gh200:4"
# The GPU nodes' partition, which every Olivia script asks for (--partition=accel).
TWIN_PARTITIONS=("accel")
TWIN_GRES=("Name=gpu Type=gh200 File=/dev/nvidia[0-3] Flags=nvidia_gpu_env")
