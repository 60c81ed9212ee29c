"""The in-container half of host binds: LD_LIBRARY_PATH and CPATH from a site profile.

Only directories that exist inside the container are added; the user's own
entries are kept (never replaced), and nothing is listed twice.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence, Tuple

from ddp_launch.fabric.common import under
from ddp_launch.plan import EnvChange
from ddp_launch.sites import SiteProfile, container_search_paths


def _existing(root: str, paths: Sequence[str]) -> Tuple[str, ...]:
    return tuple(p for p in paths if os.path.isdir(under(root, p)))


def _merge(front: Sequence[str], current: str, back: Sequence[str]) -> str:
    ordered = []
    for entry in list(front) + [e for e in current.split(":") if e] + list(back):
        if entry not in ordered:
            ordered.append(entry)
    return ":".join(ordered)


def library_path_changes(profile: SiteProfile, env: Mapping[str, str], root: str = "/") -> Tuple[EnvChange, ...]:
    """Host plugin dir first (so NCCL dlopens the host libnccl-net.so, not the image's),
    then libfabric/CXI/NCCL, then the user's entries, then appended extras."""
    paths = container_search_paths(profile)
    first = _existing(root, paths["first"])
    prepend = _existing(root, paths["prepend"])
    append = _existing(root, paths["append"])
    changes = []
    current = env.get("LD_LIBRARY_PATH", "")
    merged = _merge(first + prepend, current, append)
    if merged != current:
        changes.append(EnvChange(
            "LD_LIBRARY_PATH", merged,
            f"site {profile.name}: host libraries bound by `ddp-launch binds` (OFI plugin first, your entries kept)",
        ))
    includes = _existing(root, paths["include"])
    current_cpath = env.get("CPATH", "")
    merged_cpath = _merge(includes, current_cpath, ())
    if merged_cpath != current_cpath:
        changes.append(EnvChange("CPATH", merged_cpath, f"site {profile.name}: host libfabric headers"))
    return tuple(changes)
