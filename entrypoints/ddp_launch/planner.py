"""Probe, then plan: which questions a launch asks of this node, the probe that answers them, the pure plan.

cli.main and doctor use the same three steps:
    facts = probe(questions(argv, env));  plan = plan(argv, env, facts)
Only probe() touches the node (files, the name service, the CUDA driver); the rest is pure.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import ModuleType

from ddp_launch import facts as node, gpus
from ddp_launch.errors import LaunchError
from ddp_launch.fabric import FabricRequest, directories_to_probe, plan_fabric
from ddp_launch.facts import NodeFacts
from ddp_launch.forensics import flight_recorder_env
from ddp_launch.options import LaunchOptions, read_options
from ddp_launch.plan import LaunchPlan
from ddp_launch.rendezvous import host_name_problem, lookup_ipv4, waiting_resolver
from ddp_launch.schedulers import kubeflow, scheduler_for, torchrun


@dataclass(frozen=True)
class ProbeQuestions:
    """What the plan will need to know about this node beyond the environment."""

    head: str | None = None                 # the rendezvous host name to look up
    directories: tuple[str, ...] = ()       # does each exist (the fabric's library and plugin dirs)
    files: tuple[str, ...] = ()             # does each exist (the --script)
    cuda: bool = False                      # can the CUDA driver use the GPUs the scheduler granted
    dns_wait_s: float | None = None         # retry the lookup this long (a pod's DNS record comes late)
    plugin_dirs: tuple[str, ...] | None = None  # where to look for NCCL's net plugin (on a Slingshot node)
    loader_dirs: bool = False               # list the image's own library dirs (a site binds host libraries)


def questions(argv: Sequence[str], env: Mapping[str, str]) -> ProbeQuestions:
    """What to probe for ddp-launch's argv (without the program name) and environment (pure)."""
    return ask(read_options(argv, env), env)


def plan(argv: Sequence[str], env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    """The launch for ddp-launch's argv and environment on the node facts describe (pure)."""
    return plan_launch(read_options(argv, env), env, facts)


def ask(options: LaunchOptions, env: Mapping[str, str]) -> ProbeQuestions:
    """The questions for options and env (pure; a bad scheduler environment is refused here)."""
    scheduler = scheduler_for(options.mode, env)
    head = scheduler.head(scheduler.parse(env), options)
    name = str(head.value) if head is not None else None
    # A name no resolver takes is not asked: the plan refuses it, naming where it came from.
    if name is not None and host_name_problem(name) is not None:
        name = None
    script = options.workload.script
    directories = tuple(directories_to_probe(options.site, env))
    return ProbeQuestions(
        head=name,
        directories=directories,
        files=(script,) if script is not None else (),
        cuda=_granted_gpus_to_check(options, scheduler, env) is not None,
        dns_wait_s=options.dns_timeout_s if scheduler is kubeflow and not options.dry_run else None,
        # The workers' LD_LIBRARY_PATH is the user's with the site's directories merged in.
        plugin_dirs=tuple(d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d) + directories,
        loader_dirs=bool(directories),
    )


def probe(questions: ProbeQuestions, root: str = "/") -> NodeFacts:
    """The edge: read this node once, answering questions."""
    resolve = lookup_ipv4
    if questions.dns_wait_s is not None:
        resolve = waiting_resolver(questions.dns_wait_s, lambda line: print(line, file=sys.stderr, flush=True))
    return node.probe(root, questions.directories, questions.head, resolve,
                      gpus.probe_cuda_driver if questions.cuda else None, questions.files,
                      questions.plugin_dirs, questions.loader_dirs)


def plan_launch(options: LaunchOptions, env: Mapping[str, str], facts: NodeFacts) -> LaunchPlan:
    """The whole launch, fabric included, from options, the environment and the node's facts (pure)."""
    script = options.workload.script
    if script is not None and script not in facts.existing_files:
        raise LaunchError(f"--script {script!r} is not a file: give the path of a Python file "
                          f"(relative paths are taken from {facts.cwd})")
    scheduler = scheduler_for(options.mode, env)
    launch = scheduler.plan(scheduler.parse(env), options, env, facts)
    grant = _granted_gpus_to_check(options, scheduler, env)
    if grant is not None:
        gpus.require_usable_gpus(grant, facts.cuda_problem, on_kubernetes=scheduler is kubeflow,
                                 gpu_device_files=facts.gpu_device_files)
    fabric = plan_fabric(FabricRequest(
        env=env,
        multi_node=launch.nodes > 1,
        site=options.site,
        head_address=launch.rendezvous.host if launch.rendezvous is not None else None,
        nccl_debug=options.nccl_debug,
        require_fabric=options.require_fabric,
        gloo=options.cpu_workers is not None,
        log_dir=options.log_dir,
    ), facts)
    # Inside a torchrun we did not start, the workload runs as that torchrun set it up.
    forensics = flight_recorder_env(env) if scheduler is not torchrun else ()
    return replace(launch, fabric=fabric, env_changes=launch.env_changes + forensics)


def _granted_gpus_to_check(options: LaunchOptions, scheduler: ModuleType,
                           env: Mapping[str, str]) -> gpus.GpuGrant | None:
    """GPUs the scheduler granted, when the launch will use them: inside torchrun the agent
    already checked, and --cpu-workers is CPU on purpose."""
    if scheduler is torchrun or options.cpu_workers is not None:
        return None
    return gpus.granted_gpus(env)
