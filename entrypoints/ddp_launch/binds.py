"""`ddp-launch binds --site NAME`: print the APPTAINER_BIND value for this host.

Job scripts run it on the HOST before `apptainer run`, so it is stdlib only and
Python 3.8 compatible. stdout carries only the value; what was chosen, and why,
goes to stderr so `export APPTAINER_BIND="$(ddp-launch binds --site olivia)"` works.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Mapping, Optional, Sequence, TextIO

from ddp_launch.errors import EXIT_USAGE, LaunchError
from ddp_launch.sites import apptainer_bind_value, load_site, resolve_binds

SITE_VAR = "DDP_LAUNCH_SITE"


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ddp-launch binds",
        description="Print the APPTAINER_BIND value (host:container,...) for a site's host libraries.",
    )
    parser.add_argument("--site", default=env.get(SITE_VAR), help=f"site profile name (default: ${SITE_VAR})")
    parser.add_argument("--root", default="/", help="probe host paths under this directory (for tests)")
    parser.add_argument("--quiet", action="store_true", help="do not explain the choices on stderr")
    parser.add_argument(
        "--no-existing", action="store_true",
        help="ignore the APPTAINER_BIND already set (by default its entries are kept first)",
    )
    return parser.parse_args(list(argv))


def explain(binds, out: TextIO) -> None:
    for bind in binds:
        where = bind.host if bind.host else "-"
        print(f"ddp-launch binds: {bind.spec.name}: {where} -> {bind.spec.target}  ({bind.how})", file=out)


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    args = parse_args(argv, env)
    if not args.site:
        raise LaunchError(f"no site given; pass --site NAME or set {SITE_VAR}")
    profile = load_site(args.site, env)
    binds = resolve_binds(profile, env, args.root)
    if not args.quiet:
        explain(binds, err)
    existing = "" if args.no_existing else env.get("APPTAINER_BIND", "")
    print(apptainer_bind_value(binds, existing), file=out)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv, os.environ, sys.stdout, sys.stderr)
    except LaunchError as exc:
        print(f"ddp-launch: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
