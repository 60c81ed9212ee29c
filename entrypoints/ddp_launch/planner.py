"""One walk from the environment to the plan: parse it once, ask the node once, plan once.

cli.launch and doctor take the same steps:
    launch = parse(options, env, data);  facts = probe(questions(launch));  plan(launch, facts)
parse picks the scheduler (schedulers/__init__.py) and reads its job; data is the site profile,
its GPU vendor and the fabric defaults, read by the caller (fabric.defaults.read_fabric_data); only
probe() touches the node (files, the name service, the GPU driver); the rest is pure. Nothing here
names a scheduler: each module answers for itself what to probe and how to launch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ddp_contract.place import SCRIPT_IN_A_POD, in_a_pod
from ddp_launch import facts as node, gpus
from ddp_launch.errors import LaunchError
from ddp_launch.fabric import FabricRequest, directories_to_probe, plan_fabric
from ddp_launch.fabric.defaults import FabricData
from ddp_launch.facts import NodeFacts, ProbeQuestions
from ddp_launch.job_identity import identity_env
from ddp_launch.launch_options import LaunchOptions
from ddp_launch.plan import LaunchPlan
from ddp_launch.rendezvous import lookup_ipv4, waiting_resolver
from ddp_launch.schedulers import Scheduler, scheduler_for

__all__ = ("Launch", "NodeFacts", "ProbeQuestions", "parse", "questions", "probe", "plan")


@dataclass(frozen=True)
class Launch:
    """The launch as read, once: the user's options, the environment, the scheduler that owns
    it, its job (that scheduler's parse of env) and the fabric's data files."""

    options: LaunchOptions
    env: Mapping[str, str]
    scheduler: Scheduler
    job: object
    data: FabricData


def parse(options: LaunchOptions, env: Mapping[str, str], data: FabricData) -> Launch:
    """The scheduler for options.mode (or detected) and its job (pure; a bad scheduler environment is refused here)."""
    scheduler = scheduler_for(options.mode, env)
    if data.accelerator is None:
        raise ValueError("read the data with fabric.defaults.read_fabric_data: it names the GPU vendor")
    return Launch(options, env, scheduler, scheduler.parse(env, data.accelerator), data)


def questions(launch: Launch) -> ProbeQuestions:
    """The scheduler's questions (head, GPUs, DNS wait) and the node's (the script, the site's directories)."""
    options, env = launch.options, launch.env
    script = options.workload.script
    directories = directories_to_probe(launch.data)
    return replace(
        launch.scheduler.questions(launch.job, options),
        directories=directories,
        files=(script,) if script is not None else (),
        # The workers' LD_LIBRARY_PATH is the user's with the site's directories merged in, before it.
        plugin_dirs=directories + tuple(d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d),
        loader_dirs=bool(directories),
        accelerator=launch.data.accelerator,
    )


def probe(questions: ProbeQuestions, root: str = "/") -> NodeFacts:
    """The edge: read this node once, answering questions."""
    resolve = lookup_ipv4
    if questions.dns_wait_s is not None:
        resolve = waiting_resolver(questions.dns_wait_s, lambda line: print(line, file=sys.stderr, flush=True))
    vendor = questions.accelerator
    driver = (lambda: gpus.probe_driver(vendor)) if questions.cuda and vendor is not None else None
    # A node's own interfaces are asked of its kernel only on the node itself, not under a test's tree.
    return node.probe(root, questions.directories, questions.head, resolve, driver, questions.files,
                      questions.plugin_dirs, questions.loader_dirs, vendor, questions.peer,
                      node.interface_ipv4 if root == "/" else None, sys.path)


# Apptainer and SingularityCE set these inside every container they run (Apptainer user guide,
# "Environment and Metadata": APPTAINER_CONTAINER, the image's path; SINGULARITY_CONTAINER likewise).
CONTAINER_VARIABLES = ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER")


def script_refusal(script: str, facts: NodeFacts, env: Mapping[str, str]) -> str:
    """Why the --script cannot run here, with the fix for where this runs: a container that does not see
    the file is missing a bind (Apptainer binds $HOME, the working directory, /tmp and /var/tmp by default,
    and what APPTAINER_BIND or --bind names: Apptainer user guide, "Bind Paths and Mounts"); a pod sees the
    image and its volumes."""
    if script in facts.existing_files:
        return (f"--script {script!r} is not readable by uid {os.getuid()}: make it readable to the user the job "
                f"runs as (chmod a+r)")
    full = os.path.normpath(os.path.join(facts.cwd, script))
    container = next((env[name] for name in CONTAINER_VARIABLES if env.get(name)), None)
    if in_a_pod(env):
        fix = SCRIPT_IN_A_POD
    elif container is not None:
        runtime = "SINGULARITY" if "SINGULARITY_CONTAINER" in env and "APPTAINER_CONTAINER" not in env else "APPTAINER"
        fix = (f"the container ({container}) does not see it: if it is on the host, bind the directory that holds "
               f"it ({runtime}_BIND={os.path.dirname(full)}, which the job scripts pass on; Apptainer binds only "
               f"$HOME, the working directory, /tmp, /var/tmp and the binds named)")
    else:
        fix = "give the path of your Python file"
    return f"--script {script!r} is not a file here ({full}; relative paths are taken from {facts.cwd}): {fix}"


def plan(launch: Launch, facts: NodeFacts) -> LaunchPlan:
    """The whole launch, fabric included, from the launch as read and the node's facts (pure)."""
    options, env = launch.options, launch.env
    script = options.workload.script
    if script is not None and script not in facts.readable_files:
        raise LaunchError(script_refusal(script, facts, env))
    planned = launch.scheduler.plan(launch.job, options, env, facts)
    identity = launch.scheduler.identity(launch.job, facts)
    planned = replace(planned, changes=planned.changes + identity_env(identity, env))
    head = planned.rendezvous
    fabric = plan_fabric(FabricRequest(
        env=env,
        multi_node=planned.nodes > 1,
        head_address=head.host if head is not None else None,
        head_ipv4=head.address if head is not None else None,
        peer=facts.peer,
        nccl_debug=options.nccl_debug,
        require_fabric=options.require_fabric,
        gloo=options.cpu_workers is not None,
        log_dir=options.log_dir,
        job_name=identity.file_name,
        gpu_grant=launch.scheduler.GPU_GRANT,
    ), facts, launch.data)
    return replace(planned, changes=planned.changes + fabric.changes, notes=planned.notes + fabric.notes,
                   fabric=fabric.fabric, findings=fabric.findings)
