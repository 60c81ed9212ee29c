# shellcheck shell=bash disable=SC2034
# EPFL RCP's RunAI pods as tests/e2e/cluster/cluster.sh builds them (DDP_E2E_TWIN=rcp): two hosts
# named as a PyTorchJob's pods, each with the pod network on eth0 and the RoCE network that the
# kube-system/roce annotation adds (net1), and the RDMA device with its RoCE v2 GIDs in
# /sys/class/infiniband (tests/e2e/twins.py's RCP), shared by both pods as two pods of one node share
# an rdma/rdma device: the table lists each pod's GIDs, both on an interface named net1. The pods run
# runai/pod.sh in the Charliecloud
# image (ch-run), which is what the SLURM daemons here are not for.
#
# What this twin cannot reproduce: Kubernetes itself (the pod spec's variables are set as the
# training operator sets them, the volumes are binds), GPUs (RUNAI_NUM_OF_GPUS=0 and CPU workers),
# RoCE traffic (the GIDs are read, no verbs device answers).

# The training operator names a PyTorchJob's pods <job>-master-0, <job>-worker-N, and MASTER_ADDR
# is the master's name, a Service in front of it (Kubeflow training operator, PyTorchJob).
TWIN_NODE_NAMES=(ddp-train-master-0 ddp-train-worker-0)
TWIN_INTERFACE=eth0
# Multus names the annotation's network's interface net1 (k8snetworkplumbingwg/multus-cni), with the
# pod's address on the RoCE network: 172.18.128.3 and .4 here, which the GID table maps (twins.py).
TWIN_EXTRA_INTERFACES=(net1)
TWIN_EXTRA_SUBNETS=(172.18.128)
