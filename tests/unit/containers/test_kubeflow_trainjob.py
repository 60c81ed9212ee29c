"""kubeflow/trainingruntime.yaml and kubeflow/trainjob.yaml: a Kubeflow Trainer v2 TrainJob the API server,
Trainer's and JobSet's webhooks and Kubernetes' Job validation take, whose pods run what runai/submit.sh's
pods run, with the variables the torch plugin sets, and whose exit codes restart or end it as the
SLURM scripts' requeue does.

No Trainer v2 runs here: the rules are the operator's documented ones, each with its source, in
tests/stand_ins/trainjob.py, the fields checked against the CRDs' schemas of kubeflow/trainer v2.3.0
(vendored for the paths these manifests use: tests/unit/containers/data/kubeflow-trainer/).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys

import documented_blocks
import pytest
import yaml
from definitions_paths import REPO
from stand_ins import trainjob
from stand_ins.pytorchjob import GENERATED_ALPHABET, job_name
from test_command_blocks import LOGIN_NODE, Run, run_block
from test_runai_pod_command import dockerfile_entrypoint, pod_argv, submitted  # noqa: F401

from ddp_contract import EXIT_BAD_NODE, EXIT_REQUEUE, EXIT_USAGE

RUNTIME = REPO / "kubeflow" / "trainingruntime.yaml"
TRAINJOB = REPO / "kubeflow" / "trainjob.yaml"
PYTORCHJOB = REPO / "kubeflow" / "pytorchjob.yaml"
DOCKERFILE = REPO / "containers" / "Dockerfile"
POD_SCRIPT = REPO / "runai" / "pod.sh"
SCHEMAS = REPO / "tests" / "unit" / "containers" / "data" / "kubeflow-trainer"


def runtime() -> dict:
    return yaml.safe_load(RUNTIME.read_text())


def job() -> dict:
    return yaml.safe_load(TRAINJOB.read_text())


def runtimes() -> dict:
    found = runtime()
    return {(found["kind"], found["metadata"]["name"]): found}


def test_the_vendored_schemas_are_the_operators_own_crds():
    for name, kind in (("trainingruntime", "TrainingRuntime"), ("trainjob", "TrainJob")):
        vendored = json.loads((SCHEMAS / f"{name}.schema.json").read_text())
        assert (vendored["group"], vendored["version"], vendored["kind"]) == ("trainer.kubeflow.org", "v1alpha1", kind)
        assert vendored["source"].startswith("kubeflow/trainer v2.3.0 manifests/base/crds/trainer.kubeflow.org_")


def test_the_api_server_and_the_webhooks_take_both_and_name_each_trainjob_anew():
    assert trainjob.runtime_problems(runtime()) == []
    names = {job_name(job()) for _ in range(20)}
    assert len(names) > 1 and all(re.fullmatch(rf"ddp-train-[{GENERATED_ALPHABET}]{{5}}", n) for n in names)
    assert trainjob.trainjob_problems(job(), runtimes()) == []
    assert trainjob.trainjob_problems(job(), {}) == [
        'TrainingRuntime.trainer.kubeflow.org "ddp-train" not found: apply the runtime first']


def _edited(document: dict, change) -> dict:
    edited = copy.deepcopy(document)
    change(edited)
    return edited


def _pod_spec(manifest: dict) -> dict:
    return trainjob.trainer_job(manifest)["template"]["spec"]["template"]["spec"]


def _job_spec(manifest: dict) -> dict:
    return trainjob.trainer_job(manifest)["template"]["spec"]


def _failure_rules(manifest: dict) -> list:
    return manifest["spec"]["template"]["spec"]["failurePolicy"]["rules"]


# What the schema, the webhooks and Kubernetes refuse, one change each, with the words of the refusal:
# the checks can fail.
RUNTIME_REFUSED = {
    "a field the CRD lacks": (lambda r: r["spec"]["template"]["spec"].update(restartPolicy="OnFailure"),
                              'unknown field "restartPolicy"'),
    "a JobSet action JobSet lacks": (lambda r: _failure_rules(r)[0].update(action="Retry"), "unsupported value 'Retry'"),
    "a failure reason no Job has": (lambda r: _failure_rules(r)[1].update(onJobFailureReasons=["ExitCode76"]),
                                    "invalid job failure reason 'ExitCode76'"),
    "a rule name JobSet refuses": (lambda r: _failure_rules(r)[0].update(name="do-not-retry"), "must match"),
    "maxRestarts as a string": (lambda r: r["spec"]["template"]["spec"]["failurePolicy"].update(maxRestarts="3"),
                                "must be an integer"),
    "a pod failure policy with restarts in the pod": (lambda r: _pod_spec(r).update(restartPolicy="OnFailure"),
                                                      'only "Never" is supported when podFailurePolicy'),
    "exit code 0 under In": (lambda r: _job_spec(r)["podFailurePolicy"]["rules"][1]["onExitCodes"].update(
        operator="In", values=[0, 2]), "the value '0' cannot be used for the In operator"),
    "exit codes out of order": (lambda r: _job_spec(r)["podFailurePolicy"]["rules"][1]["onExitCodes"].update(
        values=[76, 75]), "must be unique, ordered"),
    "a container the pod lacks": (lambda r: _job_spec(r)["podFailurePolicy"]["rules"][1]["onExitCodes"].update(
        containerName="trainer"), "must be one of the container names"),
    "no container named node": (lambda r: _pod_spec(r)["containers"][0].update(name="trainer"),
                                "no container named 'node'"),
    "no trainer ancestor label": (lambda r: trainjob.trainer_job(r)["template"]["metadata"].update(labels={}),
                                  "the torch plugin finds no trainer"),
    "a variable used before it is defined": (lambda r: _pod_spec(r)["containers"][0]["env"].reverse(),
                                             "which is not defined before it"),
}


@pytest.mark.parametrize("change, refusal", RUNTIME_REFUSED.values(), ids=RUNTIME_REFUSED.keys())
def test_a_runtime_the_cluster_refuses_is_refused(change, refusal):
    found = trainjob.runtime_problems(_edited(runtime(), change))
    assert any(refusal in problem for problem in found), found


TRAINJOB_REFUSED = {
    "a reserved PET_ variable": (lambda j: j["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"}),
                                 "must not have reserved envs, invalid envs configured: ['PET_NNODES']"),
    "numNodes as a string": (lambda j: j["spec"]["trainer"].update(numNodes="2"), "must be an integer"),
    "no runtimeRef": (lambda j: j["spec"].pop("runtimeRef"), "spec.runtimeRef: Required value"),
    "a GPU count that is no quantity": (lambda j: j["spec"]["trainer"]["resourcesPerNode"]["limits"].update(
        {"nvidia.com/gpu": "four"}), "is not a quantity"),
    "the runtime of another kind": (lambda j: j["spec"]["runtimeRef"].update(kind="ClusterTrainingRuntime"),
                                    'ClusterTrainingRuntime.trainer.kubeflow.org "ddp-train" not found'),
    "a field the vendored schema leaves out": (lambda j: j["spec"].update(suspend=True), "vendor it again"),
}


@pytest.mark.parametrize("change, refusal", TRAINJOB_REFUSED.values(), ids=TRAINJOB_REFUSED.keys())
def test_a_trainjob_the_cluster_refuses_is_refused(change, refusal):
    found = trainjob.trainjob_problems(_edited(job(), change), runtimes())
    assert any(refusal in problem for problem in found), found


# The exit codes a pod ends with (ddp_contract: 2 a mistake the user can fix, 75 a stop after a
# checkpoint, 76 a bad pod), played through the Job's podFailurePolicy and the JobSet's failurePolicy.
@pytest.mark.parametrize("exit_code, action", [
    (EXIT_USAGE, "FailJobSet"),       # not retried: the same mistake again
    (EXIT_REQUEUE, "RestartJobSet"),  # every pod again, resumed from the checkpoint
    (EXIT_BAD_NODE, "RestartJobSet"),
    (1, "FailJobSet"),                # a crash: not retried, as a SLURM job's is not requeued
    (137, "FailJobSet"),
])
def test_each_exit_code_restarts_or_ends_the_trainjob_as_the_slurm_requeue_does(exit_code, action):
    assert trainjob.after_failure(runtime(), exit_code=exit_code) == action


def test_an_evicted_pod_is_started_again_uncounted_and_restarts_are_bounded_as_on_slurm():
    assert trainjob.after_failure(runtime(), condition="DisruptionTarget") == "Ignore"
    slurm = (REPO / "slurm" / "lib" / "ddp.sh").read_text()
    max_requeues = re.search(r"DDP_MAX_REQUEUES:-(\d+)", slurm).group(1)
    assert runtime()["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == int(max_requeues)
    # Without the runtime's JobSet rules every failure would restart the job (JobSet's default).
    bare = _edited(runtime(), lambda r: r["spec"]["template"]["spec"].pop("failurePolicy"))
    assert trainjob.after_failure(bare, exit_code=EXIT_USAGE) == "RestartJobSet"


@pytest.mark.parametrize("index", [0, 1])
def test_ddp_launch_plans_each_pod_from_the_variables_the_torch_plugin_sets(index, tmp_path):
    # The pod's environment as Trainer v2 builds it (PET_* from torch.go, the TrainJob's env over the
    # runtime's, JobSet's pod name), fed to the image's launcher: one torchrun per pod, c10d at node 0.
    pod = trainjob.pod(job(), runtime(), "ddp-train-x7k2q", index)
    env = {**pod["env"], "PATH": os.environ["PATH"], "PYTHONPATH": str(REPO / "entrypoints"), "HOSTNAME": pod["hostname"]}
    assert {k: v for k, v in pod["env"].items() if k.startswith("PET_")} == {
        "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": str(index),
        "PET_MASTER_ADDR": "ddp-train-x7k2q-node-0-0.ddp-train-x7k2q", "PET_MASTER_PORT": "29500"}
    done = subprocess.run([sys.executable, "-m", "ddp_launch", "--dry-run", "--json"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["mode"] == "kubeflow"
    argv = plan["argv"]
    assert "--nnodes=2" in argv and "--rdzv-backend=c10d" in argv
    assert "--rdzv-endpoint=ddp-train-x7k2q-node-0-0.ddp-train-x7k2q:29500" in argv
    assert f"--rdzv-conf=is_host={'true' if index == 0 else 'false'},read_timeout=300" in argv
    assert plan["notes"][0] == f"pod {index} of 2" + (" (rendezvous host)" if index == 0 else "")
    # auto, without a GPU here: torchrun's count of this process's CPUs (the plugin says auto for GPUs).
    assert f"--nproc-per-node={len(os.sched_getaffinity(0))}" in argv
    # The job is the TrainJob (JOB_NAME, from JobSet's label): a restarted pod finds its own run-dir lock.
    assert {"name": "DDP_JOB_ID", "value": "ddp-train-x7k2q"} == {k: v for k, v in next(
        change for change in plan["env"] if change["name"] == "DDP_JOB_ID").items() if k != "reason"}


def test_each_pod_runs_what_the_rcp_pods_run_in_a_run_dir_named_as_its_trainjob(submitted):
    pod = trainjob.pod(job(), runtime(), "ddp-train-x7k2q", 1)
    rcp_pod = pod_argv(dockerfile_entrypoint(DOCKERFILE.read_text()), submitted(*pod["args"]))
    assert pod["command"] + pod["args"] == rcp_pod
    assert pod["env"]["DDP_RUN_DIR"] == "/mnt/runs/ddp-train-x7k2q" and pod["env"]["DDP_DATA_DIR"] == "/mnt/data"
    assert pod["env"]["DDP_RESUME_RUN"] == "" and pod["gpus"] == 4
    quick_start = documented_blocks.quick_start("Kubeflow Trainer v2").text
    assert "2 pods x 4 GPUs" in quick_start and job()["spec"]["trainer"]["numNodes"] == 2


def resume_block() -> documented_blocks.Block:
    found = [block for block in documented_blocks.blocks(documented_blocks.README)
             if "DDP_RESUME_RUN" in block.text and "kubectl create -f -" in block.text]
    assert len(found) == 1, "the README has one block that continues a Kubeflow run"
    return found[0]


def test_the_readmes_resume_continues_the_first_trainjobs_run_in_a_new_trainjob(tmp_path):
    # The quick start, then the resume block, run as written with kubectl's stand-in (as the command
    # blocks' test runs them); then what the second TrainJob's pods run.
    quick_start = documented_blocks.quick_start("Kubeflow Trainer v2")
    fill = {"<job>": "'\"$(head -n 1 \"${KUBECTL_STAND_IN_STATE}/jobs\")\"'"}
    start = Run(LOGIN_NODE, fill={"<job>": '"$(head -n 1 "${KUBECTL_STAND_IN_STATE}/jobs")"'})
    script = (quick_start.text.replace("<job>", start.fill["<job>"])
              + resume_block().text.replace("<job>", fill["<job>"]))
    done, _ = run_block(documented_blocks.Block("README.md", 1, "", script, ()), Run(LOGIN_NODE), tmp_path)
    assert done.returncode == 0, done.stderr
    state = tmp_path / "kubectl"
    first, second = (state / "jobs").read_text().split()
    created = json.loads((state / "jobs.d" / f"{second}.json").read_text())
    assert created["spec"]["trainer"]["args"] == ["--epochs", "80"]
    assert {"name": "DDP_RESUME_RUN", "value": first} in created["spec"]["trainer"]["env"]

    pod = trainjob.pod(created, runtime(), second, 0)
    assert pod["env"]["DDP_RUN_DIR"] == f"/mnt/runs/{second}" and pod["env"]["DDP_RESUME_RUN"] == first
    # runai/pod.sh in that pod: the first TrainJob's run dir, with the trainer's --resume (ddp-launch is
    # a stand-in that prints its arguments).
    runs, data = tmp_path / "mnt" / "runs", tmp_path / "mnt" / "data" / "cifar-100-python"
    data.mkdir(parents=True)
    for name in ("train", "test", "meta"):
        (data / name).write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ddp-launch").write_text('#!/bin/sh\necho "ddp-launch $*"\n')
    (bin_dir / "ddp-launch").chmod(0o755)
    env = {**pod["env"], "DDP_RUN_DIR": f"{runs}/{second}", "DDP_DATA_DIR": str(data.parent),
           "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO / "entrypoints")}
    ran = subprocess.run(["bash", str(POD_SCRIPT), *pod["args"]], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert f"--run-dir {runs}/{first} --resume --epochs 80" in ran.stdout
    assert f"pod: continuing run {first} in {runs}/{first} (DDP_RESUME_RUN)" in ran.stderr


def test_the_pytorchjob_takes_the_same_two_edits():
    edits = re.findall(r"-e '(s/[^']*)'", resume_block().text)
    assert len(edits) == 2
    for manifest in (TRAINJOB, PYTORCHJOB):
        text = manifest.read_text()
        done = subprocess.run(["sed", *[word for edit in edits for word in ("-e", edit.replace("<job>", "ddp-train-b4t9z"))]],
                              input=text, capture_output=True, text=True, timeout=10, check=True)
        assert done.stdout.count("{name: DDP_RESUME_RUN, value: ddp-train-b4t9z}") >= 1, manifest
        assert '"--epochs", "80"' in done.stdout and '"--epochs", "50"' not in done.stdout, manifest
        assert yaml.safe_load(done.stdout)  # still YAML
