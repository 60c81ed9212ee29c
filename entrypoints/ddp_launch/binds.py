"""`ddp-launch binds --site NAME`: print the APPTAINER_BIND (or SINGULARITY_BIND) value for this host.

Job scripts run it on the HOST before `apptainer run`, as `python3 -m ddp_launch.binds`,
with whatever python3 the node has (3.6 on SLES 15): it and everything it imports
are stdlib only, Python 3.6 compatible and listed in entrypoints/host-modules.txt,
which `make lint` checks with vermin. stdout carries only the value; what was
chosen, and why, goes to stderr so `export APPTAINER_BIND="$(...)"` works.
The binds the user had already set come first, read as the runtime that takes the value reads them
(user_binds), so exporting it loses none of them.
"""

import argparse
import os
import sys
from typing import List, Mapping, Optional, Sequence, TextIO

from ddp_launch.errors import LaunchError, run_main
from ddp_launch.flags import FlagParser
from ddp_launch.libclosure import Closure, closure_binds
from ddp_launch.sites import CONTAINER_RUNTIMES, apptainer_bind_value, load_site, resolve_binds

PROG = "ddp-launch binds"

SITE_VAR = "DDP_LAUNCH_SITE"
RUNTIME_VAR = "DDP_CONTAINER_RUNTIME"  # slurm/lib/ddp.sh's setting: the command its steps run


def user_binds(env: Mapping[str, str], runtime: str) -> str:
    """The binds already set for runtime, as it reads them, which the printed value replaces.
    SingularityCE reads SINGULARITY_BIND (SingularityCE user guide, "Bind Paths and Mounts":
    "the $SINGULARITY_BIND (or $SINGULARITY_BINDPATH) environment variable",
    https://docs.sylabs.io/guides/latest/user-guide/bind_paths_and_mounts.html). Apptainer reads
    APPTAINER_BIND, and SINGULARITY_BIND only "when their respective APPTAINER_ ... counterparts
    are not set" (Apptainer user guide, "Singularity Compatibility",
    https://apptainer.org/docs/user/main/singularity_compatibility.html): once the job exports
    APPTAINER_BIND, a user's SINGULARITY_BIND would no longer be read, so its entries are kept here.
    The *_BINDPATH variables are read beside these and are never replaced, so they need nothing."""
    if runtime == "singularity":
        return env.get("SINGULARITY_BIND", "")
    if "APPTAINER_BIND" in env:
        return env["APPTAINER_BIND"]
    return env.get("SINGULARITY_BIND", "")


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    parser = FlagParser(
        prog=PROG, subcommand="binds", hint="see ddp-launch binds --help",
        description="Print the APPTAINER_BIND value (host:container,...) for a site's host libraries.",
    )
    parser.add_argument("--site", default=env.get(SITE_VAR), help=f"site profile name (default: ${SITE_VAR})")
    parser.add_argument("--root", default="/", help="probe host paths under this directory (for tests)")
    parser.add_argument("--quiet", action="store_true", help="do not explain the choices on stderr")
    parser.add_argument(
        "--runtime", choices=CONTAINER_RUNTIMES, default=None,
        help=f"the command that will read the value: its binds already set are kept (default: ${RUNTIME_VAR}, "
             "else the site profile's container_runtime)",
    )
    parser.add_argument(
        "--no-existing", action="store_true",
        help="ignore the binds already set (by default their entries are kept first)",
    )
    return parser.parse_args(list(argv))


def explain(binds, out: TextIO) -> None:
    for bind in binds:
        where = bind.host if bind.host else "-"
        print(f"{PROG}: {bind.spec.name}: {where} -> {bind.spec.target}  ({bind.how})", file=out)


def explain_closure(extra, out: TextIO) -> None:
    for bind in extra:
        print(f"{PROG}: added {bind.host} -> {bind.spec.target} ({bind.how})", file=out)


def warn_closure(found: Closure, out: TextIO) -> None:
    """Printed even with --quiet: each one may stop libfabric or NCCL from loading."""
    for lib in found.missing:
        print(f"{PROG}: warning: {lib.soname} (needed by {lib.needed_by}) not found on this host; "
              "not bound, so the image must provide it", file=out)
    for problem in found.unreadable:
        print(f"{PROG}: warning: cannot read {problem}; its dependencies are not bound", file=out)


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    args = parse_args(argv, env)
    if not args.site:
        raise LaunchError(f"no site given; pass --site NAME or set {SITE_VAR}")
    profile = load_site(args.site, env)
    binds = resolve_binds(profile, env, args.root)
    extra, found = closure_binds(profile, binds, env, args.root)
    if not args.quiet:
        explain(binds, err)
        explain_closure(extra, err)
    warn_closure(found, err)
    chosen = env.get(RUNTIME_VAR, "")
    runtime = args.runtime or (chosen if chosen in CONTAINER_RUNTIMES else profile.container_runtime)
    existing = "" if args.no_existing else user_binds(env, runtime)
    print(apptainer_bind_value(binds + extra, existing), file=out)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(lambda args: run(args, os.environ, sys.stdout, sys.stderr),
                    sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
