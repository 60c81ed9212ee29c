"""No scheduler: one machine, torchrun --standalone with one worker per visible GPU (or CPU workers).

The fallback of auto detection, so it reads no scheduler variables of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_launch import gpus as gpu_count
from ddp_launch.accelerators import Accelerator
from ddp_launch.errors import LaunchError
from ddp_launch.facts import NodeFacts, ProbeQuestions
from ddp_launch.forensics import flight_recorder_env
from ddp_launch.job_identity import JobIdentity
from ddp_launch.node_workers import worker_notes, workers_env, workers_per_node
from ddp_launch.launch_options import LaunchOptions
from ddp_launch.plan import LaunchPlan
from ddp_launch.torchrun_command import max_restarts, torchrun_command, torchrun_env

# --mode names and their lines in ddp-launch --help.
MODES = {"local": "otherwise: torchrun --standalone on this machine"}
# Auto detection's place (schedulers/__init__.py): last, since it takes whatever the others did not.
DETECTION_PLACE = 90
HELP = ""
NODE_NAME: tuple[str, ...] = ()   # this machine by its host name
VARIABLES: dict[str, tuple[str, ...]] = {}
GPU_GRANT = gpu_count.GrantVariables()   # none of its own: the visible devices and the device files
ENV_PREFIXES: tuple[str, ...] = ()


def detect(env: Mapping[str, str]) -> bool:
    """Always: the last of the detection order takes whatever the others did not."""
    return True


@dataclass(frozen=True)
class LocalEnv:
    """One machine has no job layout: only the GPUs it was given, if anything says so."""

    gpus: gpu_count.GpuGrant | None
    accelerator: Accelerator            # the site's GPU vendor: whose variables and device files count


def parse(env: Mapping[str, str], accelerator: Accelerator) -> LocalEnv:
    return LocalEnv(gpu_count.granted_gpus(env, accelerator, GPU_GRANT), accelerator)


def identity(job: LocalEnv, facts: NodeFacts) -> JobIdentity:
    """No job; this machine by its host name."""
    return JobIdentity(None, "", facts.hostname.split(".")[0] or None, "the host name")


def questions(job: LocalEnv, options: LaunchOptions) -> ProbeQuestions:
    """Nothing to look up (--standalone serves the rendezvous here); ask the GPU driver about granted GPUs."""
    return ProbeQuestions(cuda=gpu_count.grant_to_check(job.gpus, options.cpu_workers) is not None)


def plan(job: LocalEnv, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    if options.nodes is not None and options.nodes != 1:
        raise LaunchError(f"--nodes {options.nodes} but no scheduler was found (local mode runs on this one "
                          f"machine): start ddp-launch with srun, in a RunAI/Kubeflow job, or drop --nodes")
    gpus_here = gpu_count.count_gpus(env, facts.gpu_device_files, job.accelerator, GPU_GRANT)
    workers = workers_per_node(options, None, gpus_here)
    restarts = max_restarts(options)
    argv = torchrun_command(facts.python, "1", workers.count, None, restarts,
                            options.log_dir, options.workload)
    notes = ["no scheduler found: one machine, torchrun --standalone", *worker_notes(workers)]
    ignored = [s.source for s in (options.rdzv_host, options.rdzv_port, options.rdzv_timeout)
               if s is not None]
    if ignored:
        notes.append(f"ignored in local mode (--standalone picks a free port): {', '.join(ignored)}")
    changes = (torchrun_env(env, restarts, options.log_dir, workload=options.workload) + workers_env(workers, env, facts.cpu_count)
               + flight_recorder_env(env))
    gpu_count.require_usable_gpus(gpu_count.grant_to_check(job.gpus, options.cpu_workers), facts.cuda_problem,
                                  on_kubernetes=False, gpu_device_files=facts.gpu_device_files)
    return LaunchPlan("local", argv, changes, tuple(notes))
