"""What a Kubernetes API server with Kubeflow's training operator refuses in a PyTorchJob manifest.

Each rule names where it is documented. The operator's (kubeflow/training-operator, release 1.9):
the kinds and fields of pkg/apis/kubeflow.org/v1/pytorch_types.go and common_types.go, the webhook's
checks in pkg/apis/kubeflow.org/v1/pytorch_validation.go. Kubernetes' own: object names (API
conventions; apimachinery's NameIsDNS1035Label, IsDNS1123Subdomain), generateName, the downward
API's fieldRef paths for environment variables, and $(VAR) references to earlier variables only
("Define Dependent Environment Variables").
"""

from __future__ import annotations

import random
import re

API_VERSION, KIND = "kubeflow.org/v1", "PyTorchJob"
SPEC_FIELDS = {"runPolicy", "elasticPolicy", "pytorchReplicaSpecs", "nprocPerNode"}
REPLICA_TYPES = ("Master", "Worker")
REPLICA_FIELDS = {"replicas", "template", "restartPolicy"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CONTAINER_NAME = "pytorch"
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# The downward API's fieldRef paths an environment variable may read (Kubernetes, "Downward API",
# "Information available via fieldRef").
FIELD_REFS = re.compile(r"metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]"
                        r"|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs)")
# apimachinery's SimpleNameGenerator: generateName plus 5 characters of this alphabet.
GENERATED_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# NameIsDNS1035Label's limit, a DNS label's.
NAME_MAX = 63


def job_name(manifest: dict) -> str:
    """metadata.name, or generateName with the 5 characters the API server adds."""
    metadata = manifest.get("metadata") or {}
    if metadata.get("name"):
        return metadata["name"]
    prefix = metadata.get("generateName") or ""
    return prefix + "".join(random.choice(GENERATED_ALPHABET) for _ in range(5)) if prefix else ""


def problems(manifest: dict, name: str) -> list:
    """Why the API server or the operator's webhook would refuse manifest created as name (none: [])."""
    if not isinstance(manifest, dict) or (manifest.get("apiVersion"), manifest.get("kind")) != (API_VERSION, KIND):
        return [f"no matches for kind {manifest.get('kind')!r} in version {manifest.get('apiVersion')!r}: "
                f"a PyTorchJob is {KIND} in {API_VERSION}"]
    found = []
    if not name:
        found.append("metadata: name or generateName is required")
    elif len(name) > NAME_MAX or not DNS1035_LABEL.fullmatch(name):
        found.append(f"PyTorchJob name is invalid: {name!r} is not a DNS-1035 label")
    spec = manifest.get("spec") or {}
    found += [f"spec.{field}: unknown field" for field in sorted(set(spec) - SPEC_FIELDS)]
    if "nprocPerNode" in spec and not isinstance(spec["nprocPerNode"], str):
        found.append("spec.nprocPerNode in body must be of type string (auto, cpu, gpu or a number, quoted)")
    replicas = spec.get("pytorchReplicaSpecs")
    if not isinstance(replicas, dict) or not replicas:
        return found + ["PyTorchJobSpec is not valid"]
    for replica_type, replica in replicas.items():
        found += replica_problems(replica_type, replica)
    return found


def replica_problems(replica_type: str, replica) -> list:
    if replica_type not in REPLICA_TYPES:
        return [f"PyTorchReplicaType is {replica_type} but must be one of {list(REPLICA_TYPES)}"]
    where = f"spec.pytorchReplicaSpecs.{replica_type}"
    replica = replica or {}
    found = [f"{where}.{field}: unknown field" for field in sorted(set(replica) - REPLICA_FIELDS)]
    if replica_type == "Master" and replica.get("replicas", 1) != 1:
        found.append("PyTorchJobSpec is not valid: There must be only 1 master replica")
    if not isinstance(replica.get("replicas", 1), int):
        found.append(f"{where}.replicas in body must be of type integer")
    if replica.get("restartPolicy", "OnFailure") not in RESTART_POLICIES:
        found.append(f"{where}.restartPolicy must be one of {sorted(RESTART_POLICIES)}")
    pod = ((replica.get("template") or {}).get("spec")) or {}
    containers = pod.get("containers") or []
    if not containers:
        return found + [f"PyTorchJobSpec is not valid: containers definition expected in {replica_type}"]
    if any(not container.get("image") for container in containers):
        found.append(f"PyTorchJobSpec is not valid: Image is undefined in the container of {replica_type}")
    if not any(container.get("name") == CONTAINER_NAME for container in containers):
        found.append(f"PyTorchJobSpec is not valid: There is no container named {CONTAINER_NAME} in {replica_type}")
    volumes = {volume.get("name"): volume for volume in pod.get("volumes") or []}
    for volume_name, volume in volumes.items():
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if "persistentVolumeClaim" in volume and not (claim and DNS1123_SUBDOMAIN.fullmatch(claim)):
            found.append(f"{where} volume {volume_name}: claimName {claim!r} is not a PersistentVolumeClaim's name")
    for container in containers:
        found += container_problems(f"{where} container {container.get('name')}", container, volumes)
    return found


def container_problems(where: str, container: dict, volumes: dict) -> list:
    found = []
    for field in ("command", "args"):
        value = container.get(field, [])
        if not (isinstance(value, list) and all(isinstance(word, str) for word in value)):
            found.append(f"{where}: {field} must be a list of strings")
    defined = []
    for variable in container.get("env") or []:
        name = variable.get("name")
        if "value" in variable and not isinstance(variable["value"], str):
            found.append(f"{where}: env {name}'s value must be a string")
        path = ((variable.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if "valueFrom" in variable and not (path and FIELD_REFS.fullmatch(path)):
            found.append(f"{where}: env {name}: fieldPath {path!r} is not one the downward API gives a variable")
        for reference in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(variable.get("value", ""))):
            if reference not in defined:
                found.append(f"{where}: env {name} refers to $({reference}), which is not defined before it")
        defined.append(name)
    for mount in container.get("volumeMounts") or []:
        if mount.get("name") not in volumes:
            found.append(f"{where}: volumeMount {mount.get('name')!r} names no volume of the pod")
    return found
