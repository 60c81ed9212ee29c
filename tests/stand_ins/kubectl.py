"""kubectl: `create -f FILE|-` of a PyTorchJob or a TrainJob, `apply -f FILE` of a Trainer v2
TrainingRuntime, and `logs -f -l SELECTOR` of a job's pods, nothing else.

create and apply read the manifest as kubectl does (YAML, aliases included; `-f -` reads standard
input), refuse what the API server and the operator's webhooks refuse (pytorchjob.py for the training
operator v1, trainjob.py for Trainer v2, which also needs the TrainJob's runtime applied before), keep
the job's name in $KUBECTL_STAND_IN_STATE/jobs and its manifest in .../jobs.d/NAME.json (the runtimes
in .../runtimes.d/), and answer as kubectl does, "pytorchjob.kubeflow.org/NAME created".
logs takes a label selector (kubectl logs: -l, --selector; -f, --follow) that names a job created
before, by the label its operator gives the pods (training.kubeflow.org/job-name for a PyTorchJob,
JobSet's jobset.sigs.k8s.io/jobset-name for a TrainJob); where no pod matches, kubectl prints "No
resources found" and exits 0, and this stand-in fails instead, so that a block with a wrong name fails.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import trainjob
import yaml
from pytorchjob import job_name, problems
from record import record, refuse

JOB_LABELS = {"training.kubeflow.org/job-name": "PyTorchJob", trainjob.JOBSET_NAME_LABEL: trainjob.TRAINJOB}
POD_LABELS = {"training.kubeflow.org/job-name", "training.kubeflow.org/replica-type",
              "training.kubeflow.org/replica-index", trainjob.JOBSET_NAME_LABEL,
              "jobset.sigs.k8s.io/replicatedjob-name", "batch.kubernetes.io/job-completion-index"}
STATE = Path(os.environ["KUBECTL_STAND_IN_STATE"])
RESOURCES = {"PyTorchJob": "pytorchjob.kubeflow.org", "TrainJob": "trainjob.trainer.kubeflow.org",
             "TrainingRuntime": "trainingruntime.trainer.kubeflow.org"}


def read_manifests(args: list, verb: str) -> tuple[str, list]:
    if len(args) != 2 or args[0] not in ("-f", "--filename"):
        refuse(f"kubectl stand-in: only `kubectl {verb} -f FILE` is known, not `kubectl {verb} {' '.join(args)}`")
    if args[1] == "-":
        return "STDIN", [document for document in yaml.safe_load_all(sys.stdin.read()) if document is not None]
    path = Path(args[1])
    if args[1] != "-" and not path.is_file():
        refuse(f'error: the path "{path}" does not exist')
    return str(path), [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def runtimes() -> dict:
    folder = STATE / "runtimes.d"
    found = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        manifest = json.loads(path.read_text())
        found[(manifest["kind"], manifest["metadata"]["name"])] = manifest
    return found


def keep(folder: str, name: str, manifest: dict) -> None:
    (STATE / folder).mkdir(parents=True, exist_ok=True)
    (STATE / folder / f"{name}.json").write_text(json.dumps(manifest))


def create(args: list) -> None:
    source, documents = read_manifests(args, "create")
    for manifest in documents:
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        name = job_name(manifest)
        if kind == trainjob.TRAINJOB:
            found = trainjob.trainjob_problems(manifest, runtimes())
        elif kind in trainjob.RUNTIME_KINDS:
            found = trainjob.runtime_problems(manifest)
        else:
            found = problems(manifest, name)
        if found:
            refuse(f'Error from server: error when creating "{source}": ' + "; ".join(found))
        if kind in trainjob.RUNTIME_KINDS:
            keep("runtimes.d", name, manifest)
        else:
            STATE.mkdir(parents=True, exist_ok=True)
            with open(STATE / "jobs", "a") as jobs:
                jobs.write(name + "\n")
            keep("jobs.d", name, {**manifest, "metadata": {**manifest.get("metadata", {}), "name": name}})
        record("kubectl", ["create", *args], name=name, manifest=manifest)
        print(f"{RESOURCES.get(kind, 'pytorchjob.kubeflow.org')}/{name} created")


def apply(args: list) -> None:
    """kubectl apply: a runtime, named in its manifest (apply refuses generateName: "resource name may
    not be empty", so a job with generateName is `create`d)."""
    source, documents = read_manifests(args, "apply")
    for manifest in documents:
        name = (manifest.get("metadata") or {}).get("name")
        if not name:
            refuse(f'error: error when retrieving current configuration of "{source}": resource name may not be empty')
        found = trainjob.runtime_problems(manifest)
        if found:
            refuse(f'Error from server: error when applying "{source}": ' + "; ".join(found))
        known = (manifest["kind"], name) in runtimes()
        keep("runtimes.d", name, manifest)
        record("kubectl", ["apply", *args], name=name, manifest=manifest)
        print(f"{RESOURCES[manifest['kind']]}/{name} {'configured' if known else 'created'}")


def logs(args: list) -> None:
    selector, follow = None, False
    i = 0
    while i < len(args):
        if args[i] in ("-f", "--follow"):
            follow = True
        elif args[i] in ("-l", "--selector") and i + 1 < len(args):
            i += 1
            selector = args[i]
        elif args[i].startswith("--selector="):
            selector = args[i].split("=", 1)[1]
        else:
            refuse(f"kubectl stand-in: logs takes -f and -l SELECTOR here, not {args[i]!r}")
        i += 1
    if selector is None:
        refuse("error: expected 'logs [-f] [-p] (POD | TYPE/NAME) [-c CONTAINER]'")
    labels = dict(term.split("=", 1) for term in selector.split(",") if "=" in term)
    unknown = set(labels) - POD_LABELS
    jobs = (STATE / "jobs").read_text().split() if (STATE / "jobs").exists() else []
    named = [(label, labels[label]) for label in JOB_LABELS if label in labels]
    kind_of = {name: json.loads((STATE / "jobs.d" / f"{name}.json").read_text())["kind"] for name in jobs}
    if unknown or len(named) != 1 or named[0][1] not in jobs or kind_of[named[0][1]] != JOB_LABELS[named[0][0]]:
        refuse(f"No resources found in default namespace. (selector {selector!r}: the jobs are {jobs}, "
               f"the operators' pod labels {sorted(POD_LABELS)})")
    record("kubectl", ["logs", *args], selector=labels, follow=follow)
    print(f"kubectl stand-in: logs of {named[0][1]}")


VERBS = {"create": create, "apply": apply, "logs": logs}
if len(sys.argv) < 2 or sys.argv[1] not in VERBS:
    refuse(f'error: unknown command "{" ".join(sys.argv[1:2])}" for "kubectl"')
VERBS[sys.argv[1]](sys.argv[2:])
