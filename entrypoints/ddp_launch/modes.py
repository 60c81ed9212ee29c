"""Which launch applies, and the plan for it: detection order and dispatch, nothing else.

Detection order (the first that matches wins; --mode / DDP_LAUNCH_MODE skips it):
  1. torchrun    TORCHELASTIC_RUN_ID set: we are a torchrun worker; never nest torchrun.
  2. slurm-*     SLURM_JOB_ID set. slurm-task if any node of the step runs more than
                 one task (srun --ntasks-per-node=<GPUs>), else slurm-node (one torchrun
                 per node). Every node computes the same answer from the step's layout.
  3. kubeflow    PET_NNODES or PET_MASTER_ADDR set (RunAI, Kubeflow v1 and Trainer v2).
  4. local       anything else: one machine, torchrun --standalone.
"""

from __future__ import annotations

from collections.abc import Mapping

# Scheduler modules are imported where used: each launch needs one or two,
# and the launcher's start-up time is part of every job's start.
from ddp_launch.options import LaunchOptions
from ddp_launch.plan import LaunchPlan, Topology
from ddp_launch.rendezvous import Resolver
from ddp_launch.torchrun import HostFacts


def detect_mode(env: Mapping[str, str]) -> str:
    from ddp_launch import slurm, torchelastic

    if torchelastic.detect(env):
        return "torchrun"
    if slurm.detect(env):
        return slurm.auto_mode(slurm.parse(env))
    from ddp_launch import kubeflow
    if kubeflow.detect(env):
        return "kubeflow"
    return "local"


def build_plan(options: LaunchOptions, env: Mapping[str, str], facts: HostFacts,
               resolve: Resolver) -> tuple[LaunchPlan, Topology]:
    """The launch plan for this process (pure, given the resolver) and its topology."""
    mode = options.mode if options.mode != "auto" else detect_mode(env)
    if mode == "torchrun":
        from ddp_launch import torchelastic
        return torchelastic.plan(options, env, facts, resolve)
    if mode in ("slurm-node", "slurm-task"):
        from ddp_launch import slurm
        planner = slurm.plan_node if mode == "slurm-node" else slurm.plan_task
        return planner(slurm.parse(env), options, env, facts, resolve)
    if mode == "kubeflow":
        from ddp_launch import kubeflow
        return kubeflow.plan(kubeflow.parse(env), options, env, facts, resolve)
    from ddp_launch import local
    return local.plan(options, env, facts, resolve)
