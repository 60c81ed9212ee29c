"""Where this process runs, so that a fix names what works there: a Kubernetes pod, or a cluster's node.

Kubernetes puts KUBERNETES_SERVICE_HOST in every container's environment (Kubernetes, "Accessing
the Kubernetes API from a Pod": the API server's address "is available ... in the
KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT_HTTPS environment variables"). A pod has the
image and its claims: no Makefile, no Apptainer, no login node; its command line is the image's
ENTRYPOINT (ddp-launch) with RunAI's words, unless RunAI's --command replaces it.
Python 3.6, standard library.
"""

from typing import Mapping

POD_VARIABLE = "KUBERNETES_SERVICE_HOST"
POD_SCRIPT = "/opt/ddp/runai/pod.sh"  # containers/Dockerfile COPYs runai/pod.sh there


def in_a_pod(env: Mapping[str, str]) -> bool:
    return bool(env.get(POD_VARIABLE))


def stage_dataset(env: Mapping[str, str], data_dir: str) -> str:
    """How to put CIFAR-100 into data_dir, from here."""
    if in_a_pod(env):
        return ("stage it on the claim once, from a pod that mounts it: `python3 -m ddp_contract download {0}` "
                "(or `ddp-train --download --data-dir {0}`; RunAI: runai submit ... --command -- python3 -m "
                "ddp_contract download {0}), or set DDP_DATA_DIR to where it is".format(data_dir))
    return ("fetch it once on the login node: make data DATA_DIR={} (compute nodes may be offline), "
            "or set DDP_DATA_DIR to where it is".format(data_dir))


# How a pod trains: RunAI's --command runs the pod script in place of the image's ENTRYPOINT.
TRAIN_IN_A_POD = "to train, submit with --command -- {} and your trainer flags (runai/submit.sh does)".format(POD_SCRIPT)
# Why words reached ddp-launch in a pod: RunAI appends the words after its `--` to the image's
# ENTRYPOINT unless --command is given (Run:ai CLI reference, runai submit-dist pytorch, --command;
# Kubernetes, "Define a Command and Arguments for a Container").
WORDS_TO_THE_ENTRYPOINT = ("in a pod ddp-launch is the image's ENTRYPOINT, and RunAI hands it the words after its "
                           "`--` unless --command is given: " + TRAIN_IN_A_POD)

# Where a user's own script must be for the pods to run it.
SCRIPT_IN_A_POD = ("the pods see only their image and the volumes they mount: put the script on a claim they mount "
                   "(the run or data claim of runai/submit.sh, a volume of the Kubeflow manifest) or in the image, "
                   "and give its path in the pod")
