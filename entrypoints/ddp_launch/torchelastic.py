"""Already inside torchrun (TORCHELASTIC_RUN_ID is set): run the workload, never nest torchrun.

torchrun has set RANK, WORLD_SIZE, LOCAL_RANK and MASTER_* for this worker.
"""

from __future__ import annotations

from collections.abc import Mapping

from ddp_launch.options import LaunchOptions
from ddp_launch.plan import LaunchPlan, Topology
from ddp_launch.rendezvous import Resolver
from ddp_launch.torchrun import HostFacts

VARIABLES = {"run_id": "TORCHELASTIC_RUN_ID", "rank": "RANK", "world_size": "WORLD_SIZE"}


def detect(env: Mapping[str, str]) -> bool:
    return bool(env.get(VARIABLES["run_id"]))


def plan(options: LaunchOptions, env: Mapping[str, str], facts: HostFacts,
         resolve: Resolver) -> tuple[LaunchPlan, Topology]:
    notes = [f"inside torchrun (TORCHELASTIC_RUN_ID={env.get(VARIABLES['run_id'], '')}, "
             f"RANK={env.get('RANK', '?')}, WORLD_SIZE={env.get('WORLD_SIZE', '?')}): running the workload directly"]
    ignored = [flag for flag, value in (("--nproc-per-node", options.nproc_per_node),
                                        ("--rdzv-host", options.rdzv_host),
                                        ("--rdzv-port", options.rdzv_port),
                                        ("--log-dir", options.log_dir)) if value is not None]
    if ignored:
        notes.append(f"ignored inside torchrun: {', '.join(ignored)}")
    world, local = env.get("WORLD_SIZE", "1"), env.get("LOCAL_WORLD_SIZE", "1")
    nodes = int(world) // max(1, int(local)) if world.isdigit() and local.isdigit() else 1
    return (LaunchPlan("torchrun", options.workload.direct_argv(facts.python), (), tuple(notes)),
            Topology(max(1, nodes), env.get("MASTER_ADDR")))
