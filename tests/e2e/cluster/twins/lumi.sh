# shellcheck shell=bash disable=SC2034
# LUMI-G (CSC / EuroHPC) as tests/e2e/cluster/cluster.sh builds it (DDP_E2E_TWIN=lumi): the facts of
# its GPU nodes that slurm/lumi-multinode.sh and ddp-launch meet. The files on its nodes (the host
# libfabric under /opt/cray, libcxi, /dev/cxi0-3, /dev/kfd, /dev/dri/renderD*) are
# tests/e2e/twins.py's LUMI; the image is gpu.def built with SITE=lumi on a base laid out like LUMI's.
#
# What this twin cannot reproduce:
# - GPUs: a node's eight MI250X GCDs are a gres/gpu of eight render nodes (/dev/dri/renderD128-135)
#   that no driver answers, so SLURM grants them and sets SLURM_GPUS_ON_NODE and ROCR_VISIBLE_DEVICES
#   as on LUMI, and each task trains on CPU with gloo (DDP_LAUNCH_CPU_WORKERS), as torch finds no GPU;
# - RCCL over Slingshot: libfabric, libcxi and the RCCL plugin are real ELF files with the real
#   names and links, but stand-ins that talk to no NIC; hsn0 is a veth, hsn1-3 carry nothing;
# - SingularityCE: LUMI's `singularity` is SingularityCE's, here Apptainer's own `singularity`
#   command stands in for it (same run options, SINGULARITY_BIND read); apptainer is removed;
# - the CPU binding: SLURM_CPU_BIND's masks name LUMI's 64 cores, and these nodes run task/none.

# HPE Cray EX names its compute nodes nid and six digits; LUMI-G's are nid005000 and up (LUMI
# documentation, "GPU nodes - LUMI-G": nid005000-nid007999).
TWIN_NODE_NAMES=(nid005000 nid005001 nid005002)
# A LUMI-G node has four Slingshot NICs, hsn0-hsn3 (LUMI documentation, LUMI-G hardware; the site
# profile's NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3 from LUMI's training materials).
TWIN_INTERFACE=hsn0
TWIN_EXTRA_INTERFACES=(hsn1 hsn2 hsn3)
# One 64-core EPYC with two threads a core, and 512 GB of which jobs get 480 (LUMI documentation,
# "Slurm partitions": standard-g, 8 GPUs and 480 GB a node; the script's --mem-per-gpu=60G x 8).
TWIN_NODE_SPEC="CPUs=128 RealMemory=491520 Gres=gpu:mi250:8"
# The GPU partitions (LUMI documentation, "Slurm partitions"); the script asks for standard-g.
TWIN_PARTITIONS=("standard-g" "small-g" "dev-g")
TWIN_GRES=("Name=gpu Type=mi250 File=/dev/dri/renderD[128-135] Flags=amd_gpu_env")
# LUMI runs containers with SingularityCE's singularity and has no apptainer command
# (https://docs.lumi-supercomputer.eu/software/containers/singularity/).
TWIN_CONTAINER_COMMAND=singularity
