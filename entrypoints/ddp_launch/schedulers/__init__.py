"""The schedulers ddp-launch knows, in the order auto detection tries them; adding one is adding a module.

A scheduler is a module of this package with the shape Scheduler (below) states: the planner
(planner.py) gets one from scheduler_for and calls it through that shape, never asking which
module it has. What differs between schedulers (the GPU check, the Flight Recorder settings, the
job's identity) is in the module; its variables are named there and nowhere else
(tests/unit/launch/test_scheduler_names.py).

The registry is this package's directory: every module here but the LIBRARIES is a scheduler,
tried in the order of its DETECTION_PLACE. --mode's choices, the help's lines and the prefixes the
doctor's self-test ignores are read from the modules (modes(), help_text(), env_prefixes()).

Detection order (the first that matches wins; --mode / DDP_LAUNCH_MODE skips it):
  10 torchrun    TORCHELASTIC_RUN_ID set: we are a torchrun worker; never nest torchrun.
  20 slurm       SLURM_JOB_ID set. slurm-task if any node of the step runs more than
                 one task (srun --ntasks-per-node=<GPUs>), else slurm-node (one torchrun
                 per node). Every node computes the same answer from the step's layout.
  30 kubeflow    PET_NNODES or PET_MASTER_ADDR set (RunAI, Kubeflow v1 and Trainer v2).
  90 local       anything else: one machine, torchrun --standalone.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Mapping
from importlib import import_module
from typing import Any, Protocol, runtime_checkable

from ddp_launch.accelerators import Accelerator
from ddp_launch.facts import NodeFacts, ProbeQuestions
from ddp_launch.gpus import GrantVariables
from ddp_launch.job_identity import JobIdentity
from ddp_launch.launch_options import LaunchOptions
from ddp_launch.plan import LaunchPlan

# Modules of this package that a scheduler uses, which are not schedulers themselves.
LIBRARIES = frozenset({"nodelist"})  # SLURM's hostlist grammar (slurm.py)


@runtime_checkable
class Scheduler(Protocol):
    """What a scheduler module defines (Lightning's ClusterEnvironment, one module each).

    parse(env, accelerator) reads the scheduler's environment once into a frozen job (a bad one is
    refused there, with a LaunchError naming the variable); questions(job, options) says what to
    probe (the rendezvous host to look up, whether to ask the GPU driver, how long to wait for
    DNS); plan(job, options, env, facts) is pure (the node was read into facts); identity(job,
    facts) is which job this is (the same on every node, across its requeues and restarts) and
    this node's name in it, which the planner exports to the trainer and the job library as
    DDP_JOB_ID and DDP_NODE_NAME (job_identity.py), so that nothing else reads the scheduler's
    variables.
    """

    DETECTION_PLACE: int            # auto detection tries the modules in this order (the table above)
    MODES: Mapping[str, str]        # the --mode names it plans, each with its line in --help
    VARIABLES: Mapping[str, Any]    # question -> the variables that answer it, first set wins
    ENV_PREFIXES: tuple[str, ...]   # what every variable it sets starts with
    HELP: str                       # its paragraph in --help (how its jobs find the rendezvous), or ""
    GPU_GRANT: GrantVariables       # its variables for the GPUs it granted (gpus.py reads them from here)
    NODE_NAME: tuple[str, ...]      # the variables that name this node in the job, first set wins (or none)

    def detect(self, env: Mapping[str, str]) -> bool: ...

    def parse(self, env: Mapping[str, str], accelerator: Accelerator) -> Any: ...

    def questions(self, job: Any, options: LaunchOptions) -> ProbeQuestions: ...

    def plan(self, job: Any, options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan: ...

    def identity(self, job: Any, facts: NodeFacts) -> JobIdentity: ...


def registered() -> tuple[Scheduler, ...]:
    """Every scheduler module of this package, in detection order."""
    modules = [import_module(f"{__name__}.{found.name}") for found in pkgutil.iter_modules(__path__)
               if not found.ispkg and found.name not in LIBRARIES]
    return tuple(sorted(modules, key=lambda scheduler: scheduler.DETECTION_PLACE))


# The shipped schedulers, as imported.
DETECTION_ORDER = registered()


def modes() -> dict[str, str]:
    """Every --mode name but "auto", with its help line, in detection order."""
    return {mode: line for scheduler in registered() for mode, line in scheduler.MODES.items()}


def env_prefixes() -> tuple[str, ...]:
    """What every scheduler's own variables start with, in detection order."""
    return tuple(prefix for scheduler in registered() for prefix in scheduler.ENV_PREFIXES)


def help_text() -> str:
    """The schedulers' paragraphs for --help, in detection order."""
    return "\n\n".join(scheduler.HELP for scheduler in registered() if scheduler.HELP)


def gpu_grants() -> GrantVariables:
    """Every scheduler's GPU grant variables, in detection order: what the doctor judges a node by,
    whoever scheduled it."""
    return sum((scheduler.GPU_GRANT for scheduler in registered()), GrantVariables())


def task_as_worker() -> dict[str, str]:
    """The schedulers' task variables that a torchrun worker takes from torchrun's (a module's optional
    TASK_AS_WORKER: SLURM's, whose steps run one torchrun per node; ddp_launch/worker_env.py)."""
    return {name: said for scheduler in registered() for name, said in getattr(scheduler, "TASK_AS_WORKER", {}).items()}


def node_name(env: Mapping[str, str]) -> str | None:
    """This node as a scheduler's variables name it, for a tool that runs beside a launch, not after one
    (the doctor): the first set of every scheduler's NODE_NAME, in detection order."""
    return next((env[name] for scheduler in registered() for name in scheduler.NODE_NAME if env.get(name)), None)


def scheduler_for(mode: str, env: Mapping[str, str]) -> Scheduler:
    """The module for --mode, or for "auto" the first in detection order whose detect(env) holds."""
    for scheduler in registered():
        if mode in scheduler.MODES or (mode == "auto" and scheduler.detect(env)):
            return scheduler
    raise ValueError(f"no scheduler plans mode {mode!r}")  # options.merge_options checked it
