"""No scheduler: one machine, torchrun --standalone with one worker per visible GPU (or CPU workers).

The fallback of auto detection, so it reads no scheduler variables of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp_launch import gpus as gpu_count
from ddp_launch.errors import LaunchError
from ddp_launch.options import LaunchOptions
from ddp_launch.plan import LaunchPlan, Topology
from ddp_launch.rendezvous import Resolver
from ddp_launch.torchrun import (HostFacts, max_restarts, torchrun_command, worker_env,
                                 worker_notes, workers_per_node)


def detect(env: Mapping[str, str]) -> bool:
    return True


def plan(options: LaunchOptions, env: Mapping[str, str], facts: HostFacts,
         resolve: Resolver) -> tuple[LaunchPlan, Topology]:
    if options.nodes is not None and options.nodes != 1:
        raise LaunchError(f"--nodes {options.nodes} but no scheduler was found (local mode runs on this one "
                          f"machine): start ddp-launch with srun, in a RunAI/Kubeflow job, or drop --nodes")
    workers = workers_per_node(options, None, gpu_count.count_gpus(env, facts.device_files))
    restarts = max_restarts(options)
    argv = torchrun_command(facts.python, "1", workers.count, None, restarts,
                            options.log_dir, options.workload)
    notes = ["no scheduler found: one machine, torchrun --standalone", *worker_notes(workers)]
    ignored = [s.source for s in (options.rdzv_host, options.rdzv_port, options.rdzv_timeout)
               if s is not None]
    if ignored:
        notes.append(f"ignored in local mode (--standalone picks a free port): {', '.join(ignored)}")
    return LaunchPlan("local", argv, worker_env(workers, env, facts, restarts, options.log_dir), tuple(notes)), Topology(1, None)
