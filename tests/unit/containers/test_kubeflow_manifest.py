"""kubeflow/pytorchjob.yaml: a PyTorchJob that the API server and the training operator take, whose
pods run what runai/submit.sh's pods run on RCP's twin (tests/e2e/test_twin_rcp.py).

The rules are the operator's and Kubernetes', each with its source, in tests/stand_ins/pytorchjob.py
(which the kubectl stand-in applies to the README's Kubeflow quick start); the manifest is read with
PyYAML, as kubectl reads YAML (aliases included).
"""

from __future__ import annotations

import copy
import re

import documented_blocks
import pytest
import yaml
from definitions_paths import REPO
from stand_ins.pytorchjob import GENERATED_ALPHABET, job_name, problems
from test_runai_pod_command import dockerfile_entrypoint, dockerfile_files, pod_argv, submitted  # noqa: F401

MANIFEST = REPO / "kubeflow" / "pytorchjob.yaml"
DOCKERFILE = REPO / "containers" / "Dockerfile"
POD_SCRIPT = REPO / "runai" / "pod.sh"
JOB_NAME_LABEL = "metadata.labels['training.kubeflow.org/job-name']"


def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def container(job: dict, replica_type: str) -> dict:
    containers = job["spec"]["pytorchReplicaSpecs"][replica_type]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "pytorch")


def env(job: dict, replica_type: str) -> dict:
    return {v["name"]: v.get("value", v.get("valueFrom")) for v in container(job, replica_type)["env"]}


def test_the_operator_takes_it_and_names_each_job_anew():
    job = manifest()
    names = {job_name(job) for _ in range(20)}
    assert len(names) > 1 and all(re.fullmatch(rf"ddp-train-[{GENERATED_ALPHABET}]{{5}}", n) for n in names), names
    assert problems(job, names.pop()) == []


@pytest.mark.parametrize("replica_type", ["Master", "Worker"])
def test_each_pod_runs_what_the_rcp_pods_run(replica_type, submitted):
    # The RCP twin's pods run pod_argv(ENTRYPOINT, what runai/submit.sh gave runai); a PyTorchJob's
    # container runs its command with its args (Kubernetes' command/args replace ENTRYPOINT/CMD).
    pod = container(manifest(), replica_type)
    rcp_pod = pod_argv(dockerfile_entrypoint(DOCKERFILE.read_text()), submitted(*pod["args"]))

    assert pod["command"] + pod["args"] == rcp_pod
    assert pod["command"][0] in dockerfile_files(DOCKERFILE.read_text()), "the pod script must be in the image"


@pytest.mark.parametrize("replica_type", ["Master", "Worker"])
def test_each_job_trains_in_a_run_dir_of_its_own_on_the_claims(replica_type):
    job = manifest()
    variables = env(job, replica_type)
    mounts = {m["name"]: m["mountPath"] for m in container(job, replica_type)["volumeMounts"]}
    volumes = {v["name"]: v for v in job["spec"]["pytorchReplicaSpecs"][replica_type]["template"]["spec"]["volumes"]}

    # The operator labels each pod with its job's name (kubeflow.org's PyTorchJob guide selects the
    # pods by training.kubeflow.org/job-name); a restarted pod keeps it, a new job has its own.
    assert variables["JOB_NAME"] == {"fieldRef": {"fieldPath": JOB_NAME_LABEL}}
    assert variables["DDP_RUN_DIR"] == f"{mounts['runs']}/$(JOB_NAME)"
    assert variables["DDP_DATA_DIR"] == mounts["data"]
    assert {"data", "runs"} <= {name for name, volume in volumes.items() if "persistentVolumeClaim" in volume}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory"} and mounts["shm"] == "/dev/shm"
    # pod.sh reads each DDP_ setting given, and the site is one we have a profile for.
    pod_script = POD_SCRIPT.read_text()
    assert all(f"${{{name}" in pod_script for name in variables if name.startswith("DDP_")), variables
    assert (REPO / "containers" / "sites" / f"{variables['DDP_SITE']}.json").is_file()


def test_the_quick_starts_two_pods_of_four_gpus_are_the_manifests():
    job = manifest()
    replicas = job["spec"]["pytorchReplicaSpecs"]
    gpus = {container(job, t)["resources"]["limits"]["nvidia.com/gpu"] for t in replicas}
    block = documented_blocks.quick_start("Kubeflow PyTorchJob")
    assert sum(r["replicas"] for r in replicas.values()) == 2 and gpus == {4}
    assert "2 pods x 4 GPUs" in block.text


def _edited(change) -> dict:
    job = copy.deepcopy(manifest())
    change(job)
    return job


def _pod(job: dict, replica_type: str = "Worker") -> dict:
    return job["spec"]["pytorchReplicaSpecs"][replica_type]["template"]["spec"]


# What the webhook (pkg/apis/kubeflow.org/v1/pytorch_validation.go), the CRD's schema and Kubernetes
# refuse, one change of the manifest each, with the words of the refusal.
REFUSED = {
    "a container not named pytorch": (lambda j: _pod(j)["containers"][0].update(name="trainer"),
                                      "There is no container named pytorch in Worker"),
    "two masters": (lambda j: j["spec"]["pytorchReplicaSpecs"]["Master"].update(replicas=2),
                    "There must be only 1 master replica"),
    "a replica type other than Master and Worker": (
        lambda j: j["spec"]["pytorchReplicaSpecs"].update(Chief=j["spec"]["pytorchReplicaSpecs"].pop("Worker")),
        "PyTorchReplicaType is Chief"),
    "no image": (lambda j: _pod(j, "Master")["containers"][0].pop("image"), "Image is undefined"),
    "nprocPerNode as a number": (lambda j: j["spec"].update(nprocPerNode=4), "nprocPerNode in body must be of type string"),
    "a name that is no DNS-1035 label": (lambda j: j["metadata"].update(generateName="DDP_train-"), "DNS-1035"),
    "a variable used before it is defined": (
        lambda j: _pod(j)["containers"][0]["env"].reverse(), "refers to $(JOB_NAME), which is not defined before it"),
    "a mount of no volume": (lambda j: _pod(j)["volumes"].pop(0), "volumeMount 'data' names no volume"),
    "a label read without its quotes": (
        lambda j: _pod(j)["containers"][0]["env"][0]["valueFrom"]["fieldRef"].update(
            fieldPath="metadata.labels[training.kubeflow.org/job-name]"), "not one the downward API gives"),
    "another kind": (lambda j: j.update(kind="TFJob"), "no matches for kind 'TFJob'"),
}


@pytest.mark.parametrize("change, refusal", REFUSED.values(), ids=REFUSED.keys())
def test_a_manifest_the_operator_refuses_is_refused(change, refusal):
    job = _edited(change)
    found = problems(job, job_name(job))
    assert any(refusal in problem for problem in found), found
