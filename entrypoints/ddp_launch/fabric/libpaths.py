"""The in-container half of host binds: LD_LIBRARY_PATH and CPATH from a site profile.

Only directories that exist inside the container (facts.existing_dirs, probed for
the paths search_directories names) are added; the user's own entries are kept
(never replaced), and nothing is listed twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import AbstractSet

from ddp_launch.plan import SITE_PROFILE, EnvChange
from ddp_launch.sites import SiteProfile, container_search_paths


def search_directories(profile: SiteProfile) -> tuple[str, ...]:
    """Every container directory the profile may add, for the probe to check."""
    return tuple(path for paths in container_search_paths(profile).values() for path in paths)


def _merge(front: Sequence[str], current: str, back: Sequence[str]) -> str:
    ordered = []
    for entry in list(front) + [e for e in current.split(":") if e] + list(back):
        if entry not in ordered:
            ordered.append(entry)
    return ":".join(ordered)


def library_path_changes(profile: SiteProfile, env: Mapping[str, str], existing_dirs: AbstractSet[str],
                         image_dirs: Sequence[str] = ()) -> tuple[EnvChange, ...]:
    """Host plugin dir first (so NCCL dlopens the host libnccl-net.so, not the image's),
    then libfabric/NCCL, then the user's entries, then the image's own library dirs, then
    the closure dir (libraries the fabric's need: the image's copy of one wins), then extras.

    ld.so searches LD_LIBRARY_PATH before ld.so.cache and its default dirs (ld.so(8)), so a
    host libcurl or libssl in the closure dir would replace the image's for every process
    unless the image's dirs come before it on the path.
    """
    closure_dir = profile.closure.target if profile.closure is not None else None
    paths = {group: tuple(p for p in listed if p in existing_dirs)
             for group, listed in container_search_paths(profile).items()}
    front = tuple(p for p in paths["first"] + paths["prepend"] if p != closure_dir)
    behind_image = tuple(p for p in paths["first"] + paths["prepend"] if p == closure_dir)
    changes = []
    current = env.get("LD_LIBRARY_PATH", "")
    back = (tuple(image_dirs) if behind_image else ()) + behind_image + paths["append"]
    merged = _merge(front, current, back)
    if merged != current:
        changes.append(EnvChange(
            "LD_LIBRARY_PATH", merged,
            f"site {profile.name}: host libraries bound by `ddp-launch binds` (OFI plugin first, your entries "
            f"kept, the image's own libraries before the host's closure)", SITE_PROFILE,
        ))
    current_cpath = env.get("CPATH", "")
    merged_cpath = _merge(paths["include"], current_cpath, ())
    if merged_cpath != current_cpath:
        changes.append(EnvChange("CPATH", merged_cpath, f"site {profile.name}: host libfabric headers", SITE_PROFILE))
    return tuple(changes)
