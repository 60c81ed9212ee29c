"""What a Kubernetes cluster with Kubeflow Trainer v2 takes in a TrainingRuntime and a TrainJob, and
what it then does: the pods' environment, and what each exit code of a pod leads to.

No Trainer v2 runs here, so each rule is the documented one, with its source:
- the fields: the CRDs' schemas (kubeflow/trainer v2.3.0, manifests/base/crds), vendored for the
  paths our manifests use in tests/unit/containers/data/kubeflow-trainer/ (prune_crd.py says how),
  checked as the API server checks a structural schema; kubectl's default --validate=strict makes an
  unknown field an error (kubectl reference, "--validate": "strict ... will fail the request on
  unknown fields");
- Trainer's webhooks: a TrainJob's runtimeRef must name a runtime (pkg/webhooks/trainjob_webhook.go),
  its trainer.env may not set the torch plugin's PET_* names (pkg/runtime/framework/plugins/torch/
  torch.go, Validate; pkg/constants TorchRunReservedEnvNames);
- JobSet's webhook (kubernetes-sigs/jobset v0.12.0, pkg/webhooks/jobset_webhook.go): failure policy
  rule names match ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ and are unique, onJobFailureReasons are
  Job condition reasons (BackoffLimitExceeded, DeadlineExceeded, FailedIndexes,
  MaxFailedIndexesExceeded, PodFailurePolicy);
- Kubernetes' Job validation of a podFailurePolicy (kubernetes pkg/apis/batch/validation,
  validatePodFailurePolicy; API reference batch/v1 PodFailurePolicyRule): the pod's restartPolicy
  must be Never, actions FailJob, FailIndex, Ignore or Count (FailIndex only with
  backoffLimitPerIndex), onExitCodes operator In or NotIn, its values unique, ascending, at most 255,
  no 0 under In, containerName one of the pod's containers, exactly one of onExitCodes and
  onPodConditions per rule;
- what runs: the torch plugin's PET_* variables (torch.go, EnforceMLPolicy), the TrainJob's env
  upserted into the runtime container's (apply.UpsertEnvVars: a name there is replaced in place, a new
  one appended), the pod names and labels of JobSet (<jobset>-<replicatedJob>-<job index>-<pod index>,
  label jobset.sigs.k8s.io/jobset-name: the JobSet is named as its TrainJob); a failed pod's fate by
  the Job's podFailurePolicy ("the first rule that matches", Kubernetes "Jobs", Pod failure policy;
  FailJob fails the Job with reason PodFailurePolicy, a counted failure past backoffLimit with
  BackoffLimitExceeded) and the JobSet's failurePolicy (jobset_types.go: "rules are evaluated in
  order, and only the first matching rule will be executed. If no matching rule is found, the
  RestartJobSet action is applied").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

try:  # run as the kubectl stand-in's module, from this directory
    from pytorchjob import container_problems
except ModuleNotFoundError:  # imported by the unit tests as stand_ins.trainjob
    from stand_ins.pytorchjob import container_problems

SCHEMAS = Path(__file__).resolve().parents[1] / "unit" / "containers" / "data" / "kubeflow-trainer"
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
TRAINJOB = "TrainJob"
# pkg/constants: the trainer's ancestor label, its replicated job and container name, its port.
ANCESTOR_LABEL, TRAINER = "trainer.kubeflow.org/trainjob-ancestor-step", "trainer"
NODE = "node"
TRAINER_PORT = 29500
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RULE_NAME = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
JOB_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded", "FailedIndexes", "MaxFailedIndexesExceeded",
                       "PodFailurePolicy")
POD_FAILURE_ACTIONS = ("FailJob", "FailIndex", "Ignore", "Count")
TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def schema_for(kind: str) -> dict:
    name = "trainjob" if kind == TRAINJOB else "trainingruntime"
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def structural_problems(schema: dict, value, path: str) -> list:
    """value against a CRD's (vendored) openAPIV3Schema node, as the API server checks it."""
    if schema.get("vendored") is False:
        return [f"{path}: a field the vendored CRD schema leaves out: vendor it again "
                f"(tests/unit/containers/data/kubeflow-trainer/prune_crd.py)"]
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        if not ok:
            return [f"{path}: must be an integer or a string"]
        if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
            return [f"{path}: {value!r} is not a quantity"]
        return []
    expected = schema.get("type")
    if expected == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{path}: must be an integer, not {value!r}"]
    elif expected in TYPES and not isinstance(value, TYPES[expected]):
        return [f"{path}: must be of type {expected}, not {type(value).__name__}"]
    found = []
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: unsupported value {value!r}: supported values {schema['enum']}")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            found.append(f"{path}: length {len(value)} out of bounds")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            found.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            found.append(f"{path}: {value} out of bounds")
    if isinstance(value, dict):
        found += [f"{path}.{name}: Required value" for name in schema.get("required", []) if name not in value]
        properties = schema.get("properties")
        for name, item in value.items():
            if properties is not None and name in properties:
                found += structural_problems(properties[name], item, f"{path}.{name}")
            elif "additionalProperties" in schema:
                found += structural_problems(schema["additionalProperties"], item, f"{path}.{name}")
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                found.append(f'{path}: unknown field "{name}"')
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            found.append(f"{path}: must have at most {schema['maxItems']} items")
        for index, item in enumerate(value):
            found += structural_problems(schema.get("items", {}), item, f"{path}[{index}]")
    return found


def kind_problems(manifest) -> list:
    if not isinstance(manifest, dict) or manifest.get("apiVersion") != API_VERSION or \
            manifest.get("kind") not in (*RUNTIME_KINDS, TRAINJOB):
        return [f"no matches for kind {manifest.get('kind')!r} in version {manifest.get('apiVersion')!r}: "
                f"Trainer v2's kinds are {', '.join((*RUNTIME_KINDS, TRAINJOB))} in {API_VERSION}"]
    return structural_problems(schema_for(manifest["kind"])["schema"], manifest, manifest["kind"])


def trainer_job(runtime: dict) -> dict | None:
    """The runtime's replicated job the torch plugin puts the trainer in (its ancestor label)."""
    for job in runtime["spec"]["template"]["spec"].get("replicatedJobs", []):
        if ((job.get("template") or {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) == TRAINER:
            return job
    return None


def runtime_problems(runtime: dict) -> list:
    """A TrainingRuntime the API server, JobSet's webhook and Kubernetes' Job validation take ([])."""
    found = kind_problems(runtime)
    if found:
        return found
    spec = runtime["spec"]["template"]["spec"]
    rules = (spec.get("failurePolicy") or {}).get("rules", [])
    names = [rule.get("name") for rule in rules]
    for index, rule in enumerate(rules):
        where = f"spec.template.spec.failurePolicy.rules[{index}]"
        if not RULE_NAME.fullmatch(rule.get("name", "")):
            found.append(f"{where}.name: {rule.get('name')!r} must match {RULE_NAME.pattern}")
        if names.count(rule.get("name")) > 1:
            found.append(f"{where}.name: rule names must be unique")
        found += [f"invalid job failure reason '{reason}' in failure policy is not a recognized job failure reason"
                  for reason in rule.get("onJobFailureReasons", []) if reason not in JOB_FAILURE_REASONS]
    job = trainer_job(runtime)
    if job is None:
        return found + [f"no replicated job labelled {ANCESTOR_LABEL}: {TRAINER}: the torch plugin finds no trainer"]
    job_spec = job["template"]["spec"]
    pod = job_spec["template"]["spec"]
    containers = {container.get("name"): container for container in pod.get("containers", [])}
    if NODE not in containers:
        found.append(f"the trainer's pods have no container named {NODE!r}: the torch plugin sets PET_* in that one")
    volumes = {volume.get("name"): volume for volume in pod.get("volumes") or []}
    for name, container in containers.items():
        found += container_problems(f"container {name}", container, volumes)
    found += pod_failure_policy_problems(job_spec, pod, containers)
    return found


def pod_failure_policy_problems(job_spec: dict, pod: dict, containers: dict) -> list:
    policy = job_spec.get("podFailurePolicy")
    if policy is None:
        return []
    found = []
    if pod.get("restartPolicy") != "Never":
        found.append("spec.template.spec.restartPolicy: Invalid value: only \"Never\" is supported when "
                     "podFailurePolicy is specified")
    for index, rule in enumerate(policy.get("rules", [])):
        where = f"spec.podFailurePolicy.rules[{index}]"
        action = rule.get("action")
        if action not in POD_FAILURE_ACTIONS:
            found.append(f"{where}.action: Unsupported value: {action!r}: supported values {POD_FAILURE_ACTIONS}")
        if action == "FailIndex" and "backoffLimitPerIndex" not in job_spec:
            found.append(f"{where}.action: FailIndex needs backoffLimitPerIndex")
        if ("onExitCodes" in rule) == ("onPodConditions" in rule):
            found.append(f"{where}: exactly one of onExitCodes and onPodConditions is required")
        codes = rule.get("onExitCodes")
        if codes is None:
            continue
        values = codes.get("values", [])
        if codes.get("operator") not in ("In", "NotIn"):
            found.append(f"{where}.onExitCodes.operator: Unsupported value: {codes.get('operator')!r}")
        if values != sorted(set(values)) or not 0 < len(values) <= 255:
            found.append(f"{where}.onExitCodes.values: must be unique, ordered, 1 to 255 of them")
        if codes.get("operator") == "In" and 0 in values:
            found.append(f"{where}.onExitCodes.values: the value '0' cannot be used for the In operator")
        if "containerName" in codes and codes["containerName"] not in containers:
            found.append(f"{where}.onExitCodes.containerName: must be one of the container names in the pod template")
    return found


def trainjob_problems(trainjob: dict, runtimes: dict) -> list:
    """A TrainJob the API server and Trainer's webhook take, given the runtimes by (kind, name) ([])."""
    found = kind_problems(trainjob)
    if found:
        return found
    ref = trainjob["spec"]["runtimeRef"]
    key = (ref.get("kind", "ClusterTrainingRuntime"), ref["name"])
    if ref.get("apiGroup", GROUP) != GROUP or key not in runtimes:
        return [f'{key[0]}.{GROUP} "{key[1]}" not found: apply the runtime first']
    env = [variable["name"] for variable in (trainjob["spec"].get("trainer") or {}).get("env", [])]
    reserved = sorted(set(env) & set(RESERVED_ENV))
    if reserved:
        found.append(f"spec.trainer.env: Invalid value: must not have reserved envs, invalid envs configured: {reserved}")
    return found


def _upsert(env: list, variables: list) -> list:
    merged = [dict(variable) for variable in env]
    for variable in variables:
        at = next((i for i, old in enumerate(merged) if old["name"] == variable["name"]), None)
        if at is None:
            merged.append(dict(variable))
        else:
            merged[at] = dict(variable)
    return merged


def pod(trainjob: dict, runtime: dict, name: str, index: int) -> dict:
    """The trainer pod `index` of TrainJob `name`: its host name, command, args and environment as its
    container sees them (valueFrom and $(VAR) resolved), with the number of GPUs it asked for."""
    job = trainer_job(runtime)
    template = job["template"]["spec"]["template"]
    container = next(c for c in template["spec"]["containers"] if c["name"] == NODE)
    trainer = trainjob["spec"].get("trainer") or {}
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    gpus = int(((trainer.get("resourcesPerNode") or container.get("resources") or {}).get("limits") or {})
               .get("nvidia.com/gpu", 0))
    nproc = str(trainer["numProcPerNode"]) if "numProcPerNode" in trainer else "auto"
    env = _upsert(container.get("env", []), trainer.get("env", []))
    env = _upsert(env, [{"name": "PET_NNODES", "value": str(nodes)},
                        {"name": "PET_NPROC_PER_NODE", "value": nproc},
                        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
                        {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"},
                        {"name": "PET_MASTER_PORT", "value": str(TRAINER_PORT)}])
    fields = {COMPLETION_INDEX: str(index), f"metadata.labels['{JOBSET_NAME_LABEL}']": name,
              f"metadata.labels['{ANCESTOR_LABEL}']": TRAINER}
    resolved: dict = {}
    for variable in env:
        if "valueFrom" in variable:
            resolved[variable["name"]] = fields[variable["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            resolved[variable["name"]] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                                                lambda m: resolved.get(m.group(1), m.group(0)), variable.get("value", ""))
    return {"hostname": f"{name}-{NODE}-0-{index}", "command": trainer.get("command", container.get("command", [])),
            "args": trainer.get("args", container.get("args", [])), "env": resolved, "gpus": gpus}


def after_failure(runtime: dict, exit_code: int | None = None, condition: str | None = None) -> str:
    """What a failed trainer pod leads to: "Ignore" (the Job starts it again, uncounted), or the
    JobSet's action on the failed Job (FailJobSet, RestartJobSet, ...)."""
    job_spec = trainer_job(runtime)["template"]["spec"]
    action = "Count"
    for rule in (job_spec.get("podFailurePolicy") or {}).get("rules", []):
        codes = rule.get("onExitCodes")
        if codes is not None and exit_code is not None and codes.get("containerName", NODE) == NODE:
            matched = (exit_code in codes["values"]) == (codes["operator"] == "In")
        else:
            matched = condition is not None and any(c["type"] == condition for c in rule.get("onPodConditions", []))
        if matched:
            action = rule["action"]
            break
    if action == "Ignore":
        return "Ignore"
    failed = 1  # this pod, the Job's first failure
    if action == "FailJob":
        reason = "PodFailurePolicy"
    elif failed > job_spec.get("backoffLimit", 6):  # the Job's default backoffLimit is 6
        reason = "BackoffLimitExceeded"
    else:
        return "Retry the pod in its Job"
    for rule in (runtime["spec"]["template"]["spec"].get("failurePolicy") or {}).get("rules", []):
        if not rule.get("onJobFailureReasons") or reason in rule["onJobFailureReasons"]:
            return rule["action"]
    return "RestartJobSet"
