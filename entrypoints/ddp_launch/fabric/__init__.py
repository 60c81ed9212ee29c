"""Fabric environment for NCCL/libfabric: Slingshot (CXI), InfiniBand/RoCE, Ethernet.

Contract with the launcher: cli builds a FabricRequest from plain data and
adds fabric_env_changes(request) to the launch plan. Values are set only where
the user has not set them; each change carries its reason (source) for --dry-run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

from ddp_launch.plan import EnvChange


@dataclass(frozen=True)
class FabricRequest:
    env: Mapping[str, str]          # the environment the launcher was started with
    multi_node: bool                # more than one node in this job step
    site: Optional[str] = None      # --site / DDP_LAUNCH_SITE, e.g. "olivia"; None = detect
    head_address: Optional[str] = None  # rendezvous host, for route-based interface choice
    root: str = "/"                 # filesystem root for /sys and /dev probes (tests use fake trees)
    nccl_debug: Optional[str] = None    # --nccl-debug LEVEL
    require_fabric: bool = False    # --require-fabric


def fabric_env_changes(request: FabricRequest) -> Tuple[EnvChange, ...]:
    """Placeholder until the fabric module lands (issue 4): no changes."""
    return ()
