"""The schedulers ddp-launch knows, in the order auto detection tries them; adding one is adding a module.

Every module has the same shape: MODES (the --mode names it plans, each with its line in
--help), VARIABLES (question ->
the variables that answer it, first set wins), ENV_PREFIXES (what every variable it sets starts
with), detect(env), parse(env, accelerator) -> a frozen job,
questions(job, options) -> ProbeQuestions (what it needs probed: the rendezvous host to look
up, whether to ask the GPU driver about the GPUs it granted, how long to wait for DNS),
plan(job, options, env, facts) -> LaunchPlan (pure: the node was read into facts, the head's
lookup included), and identity(job, facts) -> JobIdentity (which job this is and this node's name
in it, from the scheduler's own variables; the planner exports it as DDP_JOB_ID and DDP_NODE_NAME,
ddp_launch/job_identity.py). The planner calls each once (planner.py) and never asks which module it has:
what differs between schedulers (the GPU check, the Flight Recorder settings) is in the module.
A new scheduler is one new module and its place in DETECTION_ORDER: --mode's choices and the
help's lines are read from the modules (MODES below; options.py uses them).

Detection order (the first that matches wins; --mode / DDP_LAUNCH_MODE skips it):
  1. torchrun    TORCHELASTIC_RUN_ID set: we are a torchrun worker; never nest torchrun.
  2. slurm       SLURM_JOB_ID set. slurm-task if any node of the step runs more than
                 one task (srun --ntasks-per-node=<GPUs>), else slurm-node (one torchrun
                 per node). Every node computes the same answer from the step's layout.
  3. kubeflow    PET_NNODES or PET_MASTER_ADDR set (RunAI, Kubeflow v1 and Trainer v2).
  4. local       anything else: one machine, torchrun --standalone.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import ModuleType

from ddp_launch.schedulers import kubeflow, local, slurm, torchrun

DETECTION_ORDER = (torchrun, slurm, kubeflow, local)
# Every --mode name but "auto", with its help line, in detection order.
MODES = {mode: line for scheduler in DETECTION_ORDER for mode, line in scheduler.MODES.items()}
# What every scheduler's own variables start with, in detection order.
ENV_PREFIXES = tuple(prefix for scheduler in DETECTION_ORDER for prefix in scheduler.ENV_PREFIXES)


def scheduler_for(mode: str, env: Mapping[str, str]) -> ModuleType:
    """The module for --mode, or for "auto" the first in DETECTION_ORDER whose detect(env) holds."""
    for scheduler in DETECTION_ORDER:
        if mode in scheduler.MODES or (mode == "auto" and scheduler.detect(env)):
            return scheduler
    raise ValueError(f"no scheduler plans mode {mode!r}")  # options.merge_options checked it

