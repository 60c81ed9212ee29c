"""kubectl: `create -f FILE` (or `-f -`, stdin) of a PyTorchJob and `logs -f -l SELECTOR` of its pods, nothing else.

create reads the manifest as kubectl does (YAML, aliases included), refuses what the API server and
the training operator's webhook refuse (pytorchjob.py), keeps the job's name in
$KUBECTL_STAND_IN_STATE/jobs and answers as kubectl does, "pytorchjob.kubeflow.org/NAME created".
logs takes a label selector (kubectl logs: -l, --selector; -f, --follow) whose
training.kubeflow.org/job-name is a job created before; where no pod matches, kubectl prints "No
resources found" and exits 0, and this stand-in fails instead, so that a block with a wrong name fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml
from pytorchjob import job_name, problems
from record import record, refuse

JOB_LABEL = "training.kubeflow.org/job-name"
POD_LABELS = {JOB_LABEL, "training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index"}
STATE = Path(os.environ["KUBECTL_STAND_IN_STATE"])


def create(args: list) -> None:
    if len(args) != 2 or args[0] not in ("-f", "--filename"):
        refuse(f"kubectl stand-in: only `kubectl create -f FILE` is known, not `kubectl create {' '.join(args)}`")
    # `-f -` reads the manifest from stdin (kubectl create --help: "Create a pod based on the JSON passed
    # into stdin: cat pod.json | kubectl create -f -").
    path = Path(args[1])
    if args[1] != "-" and not path.is_file():
        refuse(f'error: the path "{path}" does not exist')
    text = sys.stdin.read() if args[1] == "-" else path.read_text()
    documents = [document for document in yaml.safe_load_all(text) if document is not None]
    for manifest in documents:
        name = job_name(manifest)
        found = problems(manifest, name)
        if found:
            refuse(f'Error from server: error when creating "{path}": ' + "; ".join(found))
        STATE.mkdir(parents=True, exist_ok=True)
        with open(STATE / "jobs", "a") as jobs:
            jobs.write(name + "\n")
        record("kubectl", ["create", *args], name=name, manifest=manifest)
        print(f"pytorchjob.kubeflow.org/{name} created")


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
    if unknown or labels.get(JOB_LABEL) not in jobs:
        refuse(f"No resources found in default namespace. (selector {selector!r}: the jobs are {jobs}, "
               f"the operator's pod labels {sorted(POD_LABELS)})")
    record("kubectl", ["logs", *args], selector=labels, follow=follow)
    print(f"kubectl stand-in: logs of {labels[JOB_LABEL]}")


VERBS = {"create": create, "logs": logs}
if len(sys.argv) < 2 or sys.argv[1] not in VERBS:
    refuse(f'error: unknown command "{" ".join(sys.argv[1:2])}" for "kubectl"')
VERBS[sys.argv[1]](sys.argv[2:])
