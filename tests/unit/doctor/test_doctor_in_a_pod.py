"""doctor in a RunAI/Kubeflow pod: its fixes name what works there, not a login node's make or Apptainer's flags.

A pod has the image and its claims (no Makefile, no apptainer, no login node), and Kubernetes puts
KUBERNETES_SERVICE_HOST in every container (Kubernetes, "Accessing the Kubernetes API from a Pod").
"""

from __future__ import annotations

import pytest
from fakes.node import RCP_GIDS
from test_doctor import TORCH, FakeProbes, doctor

# A RunAI pod of `runai submit-dist pytorch --workers=1 -g 4` (EPFL RCP, epfml/getting-started).
POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "RANK": "1", "WORLD_SIZE": "8",
       "MASTER_ADDR": "10.96.0.10", "MASTER_PORT": "23456", "RUNAI_NUM_OF_GPUS": "4"}
NO_GPU = dict(TORCH, cuda_device_count=0)


def test_in_a_pod_a_missing_dataset_is_staged_from_a_pod_not_with_make_on_a_login_node(node, tmp_path):
    _, checks, _ = doctor(node, ["--offline", "--data-dir", str(tmp_path)], POD)
    fix = checks["dataset"]["fix"]
    assert f"python3 -m ddp_contract download {tmp_path}" in fix and f"ddp-train --download --data-dir {tmp_path}" in fix
    assert "--command" in fix and "make" not in fix and "login node" not in fix


def test_on_a_cluster_node_a_missing_dataset_is_fetched_on_the_login_node(node, tmp_path):
    _, checks, _ = doctor(node, ["--offline", "--data-dir", str(tmp_path)], {"SLURM_JOB_ID": "1"})
    assert checks["dataset"]["fix"].startswith(f"fetch it once on the login node: make data DATA_DIR={tmp_path}")


def test_in_a_pod_gpus_granted_but_invisible_name_the_pods_gpu_request_not_apptainer(node):
    node.net("eth0")
    code, checks, _ = doctor(node, ["--offline"], POD, FakeProbes(torch=NO_GPU))
    assert code == 1 and checks["gpus"]["status"] == "FAIL"
    assert "nvidia.com/gpu" in checks["gpus"]["fix"] and "apptainer" not in checks["gpus"]["fix"]
    assert "--nv" not in checks["gpus"]["fix"]


def test_in_a_pod_without_gpus_the_fix_requests_them_for_the_pod(node):
    node.net("eth0")
    _, checks, _ = doctor(node, ["--offline"], {**POD, "RUNAI_NUM_OF_GPUS": "0"}, FakeProbes(torch=NO_GPU))
    assert checks["gpus"]["status"] == "WARN"
    assert checks["gpus"]["fix"] == "request GPUs for the pod (nvidia.com/gpu; RunAI: -g N)"


def rcp_pod(node, rdma: bool) -> None:
    node.net("eth0", "net1")
    if rdma:
        node.rdma("mlx5_bond_0", RCP_GIDS)


def test_on_rcp_a_pod_without_its_roce_device_fails_naming_runais_rdma_flags(node):
    rcp_pod(node, rdma=False)
    _, checks, _ = doctor(node, ["--offline", "--site", "rcp"], {**POD, "RUNAI_NUM_OF_GPUS": "0"},
                          FakeProbes(torch=NO_GPU))
    assert checks["fabric devices"]["status"] == "FAIL"
    assert "--extended-resource rdma/rdma=1" in checks["fabric devices"]["fix"]


@pytest.mark.parametrize("rdma", [False, True])
def test_with_nccl_ib_disable_no_roce_is_expected_of_an_rcp_pod(node, rdma):
    # runai/submit.sh's RUNAI_RDMA=0 asks for no RoCE and sets NCCL_IB_DISABLE=1 in the pods: NCCL then
    # "will fall back to using IP sockets" (NCCL's environment variables, NCCL_IB_DISABLE), as the launcher plans.
    rcp_pod(node, rdma=rdma)
    _, checks, _ = doctor(node, ["--offline", "--site", "rcp"],
                          {**POD, "RUNAI_NUM_OF_GPUS": "0", "NCCL_IB_DISABLE": "1"}, FakeProbes(torch=NO_GPU))
    assert checks["fabric devices"]["status"] == "OK"
    assert checks["fabric devices"]["detail"].startswith("fabric ethernet")
    assert checks["launch plan"]["status"] == "OK"


def test_on_a_cluster_node_without_its_hca_the_fix_is_the_partition_not_runai(node):
    node.net("eth0")
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "raven[0123,0124]", "SLURM_NODEID": "0",
           "SLURMD_NODENAME": "raven0123", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "raven[0123,0124]"}
    _, checks, _ = doctor(node, ["--offline", "--site", "raven"], env, FakeProbes(torch=NO_GPU))
    assert checks["fabric devices"]["status"] == "FAIL"
    assert "runai" not in checks["fabric devices"]["fix"].lower()
