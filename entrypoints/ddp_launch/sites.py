"""Site profiles on a node: each bind's host path found, the APPTAINER_BIND value, the search paths.

The profile itself is read by ddp_contract.sites (the trainer's fabric gate reads it too); its
names are re-exported here for the launcher's modules. Runs on the HOST in job scripts (SLES 15's
python3 is 3.6) and inside the image, so it uses only the standard library and Python 3.6 syntax
(`make lint` checks it with vermin).
"""

import glob
import os
import re
import sys
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, TextIO, Tuple

from ddp_contract.data_files import SITES_DIR_VAR, read_json_file, sites_dirs
from ddp_contract.sites import (ACCELERATORS, CONTAINER_RUNTIMES, LIBRARY_ORDERS, BindSpec, ClosureSpec, EnvDefault,
                                SiteProfile, SrunArg, available_sites, load_site, parse_profile, read_profile)
from ddp_launch.errors import LaunchError, run_main
from ddp_launch.flags import FlagParser

__all__ = ("ACCELERATORS", "CONTAINER_RUNTIMES", "LIBRARY_ORDERS", "SITES_DIR_VAR", "BindSpec",
           "ClosureSpec", "EnvDefault", "SiteProfile", "SrunArg", "available_sites", "load_site", "parse_profile",
           "read_json_file", "read_profile", "sites_dirs", "version_key", "host_path", "ResolvedBind",
           "resolve_bind", "resolve_binds", "apptainer_bind_value", "container_search_paths", "run", "main")


def version_key(path: str) -> Tuple[Tuple[int, object], ...]:
    """Natural sort key: 2.3.1 > 1.22.0 > 1.9.0, digits compared as numbers."""
    parts = re.findall(r"\d+|\D+", path)
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


def host_path(root: str, path: str) -> str:
    """path as seen under a probe root ("/" on a real host, a fake tree in tests)."""
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


class ResolvedBind(NamedTuple):
    spec: BindSpec
    host: Optional[str]  # None: optional and not found
    how: str             # why this host path, for the user


def resolve_bind(spec: BindSpec, env: Mapping[str, str], root: str = "/") -> ResolvedBind:
    """The module root if loaded, else the newest glob match; say which."""
    if spec.env and env.get(spec.env):
        candidate = env[spec.env]
        if os.path.exists(host_path(root, candidate)):
            return ResolvedBind(spec, host_path(root, candidate), f"${spec.env} (loaded module)")
        raise LaunchError(
            f"bind {spec.name}: ${spec.env} is {candidate} but that path does not exist; "
            f"reload the module or unset {spec.env}"
        )
    if spec.glob:
        matches = sorted(glob.glob(host_path(root, spec.glob)), key=version_key)
        if matches:
            chosen = matches[-1]
            if len(matches) > 1:
                others = ", ".join(os.path.basename(m.rstrip("/")) for m in matches[:-1])
                how = f"newest match of {spec.glob} (also found: {others})"
            else:
                how = f"only match of {spec.glob}"
            return ResolvedBind(spec, chosen, how)
    if not spec.required:
        return ResolvedBind(spec, None, "not found; optional, skipped")
    looked = " and ".join(
        part for part in (f"${spec.env} is unset" if spec.env else "", f"nothing matches {spec.glob}" if spec.glob else "") if part
    )
    fix = spec.hint or "install it or edit the site profile"
    raise LaunchError(f"bind {spec.name}: no host path found ({looked}); {fix}")


def resolve_binds(profile: SiteProfile, env: Mapping[str, str], root: str = "/") -> Tuple[ResolvedBind, ...]:
    return tuple(resolve_bind(spec, env, root) for spec in profile.binds)


def apptainer_bind_value(binds: Sequence[ResolvedBind], existing: str = "") -> str:
    """APPTAINER_BIND: the user's existing entries first, then ours (src:dst, comma-separated)."""
    entries: List[str] = [e for e in existing.split(",") if e] if existing else []
    for bind in binds:
        if bind.host is None:
            continue
        if "," in bind.host or ":" in bind.host:
            raise LaunchError(f"bind {bind.spec.name}: host path {bind.host} contains ',' or ':', which APPTAINER_BIND cannot carry")
        entries.append(f"{bind.host}:{bind.spec.target}")
    return ",".join(entries)


def container_search_paths(profile: SiteProfile) -> Dict[str, Tuple[str, ...]]:
    """LD_LIBRARY_PATH entries grouped by order, and CPATH entries, as declared."""
    groups: Dict[str, List[str]] = {order: [] for order in LIBRARY_ORDERS}
    includes: List[str] = []
    for spec in profile.binds:
        groups[spec.order].extend(spec.library_path)
        includes.extend(spec.include_path)
    result = {order: tuple(paths) for order, paths in groups.items()}
    result["include"] = tuple(includes)
    return result


# -- the job scripts' question: python3 -m ddp_launch.sites --site SITE srun-args ----------------

PROG = "python3 -m ddp_launch.sites"


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO) -> int:
    """Print the site's srun options for the training step, one word a line (none: nothing)."""
    parser = FlagParser(prog=PROG, subcommand="sites", hint=f"see {PROG} --help",
                        description="Answer a job script's question about the site profile.")
    parser.add_argument("--site", default=env.get("DDP_SITE") or None, required=not env.get("DDP_SITE"),
                        help=f"site profile (default $DDP_SITE); also found in ${SITES_DIR_VAR}")
    parser.add_argument("question", choices=("srun-args",),
                        help="srun-args: the options the training step's srun takes, one a line")
    args = parser.parse_args(list(argv))
    for item in load_site(args.site, env).srun_args:
        print(item.value, file=out)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(lambda args: run(args, os.environ, sys.stdout), sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
