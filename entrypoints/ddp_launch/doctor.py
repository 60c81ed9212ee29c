"""`ddp-launch doctor`: a preflight to run on a node before burning a big allocation.

Prints OK/WARN/FAIL per check with the fix; exit 1 when anything FAILs; --json for machines.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Mapping, Optional, Sequence, TextIO

from ddp_launch.doctor_checks import FAIL, REAL_PROBES, Check, Probes, make_context, run_checks
from ddp_launch.errors import EXIT_USAGE, LaunchError
from ddp_launch.sites import load_site

EXIT_FAILED_CHECK = 1


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ddp-launch doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true", help="skip network checks (head node reachability)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--site", default=env.get("DDP_LAUNCH_SITE"), help="site profile (default: $DDP_LAUNCH_SITE)")
    parser.add_argument("--data-dir", default=env.get("DDP_DATA_DIR", "data"), help="where CIFAR-100 should be")
    parser.add_argument("--root", default="/", help="probe /sys, /dev and /proc under this directory (for tests)")
    return parser.parse_args(list(argv))


def render_text(checks: Sequence[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{check.status:<4}  {check.name}: {check.detail}")
        if check.fix and check.status != "OK":
            lines.append(f"      fix: {check.fix}")
    failed = sum(c.status == FAIL for c in checks)
    lines.append(f"doctor: {failed} failed" if failed else "doctor: no failures")
    return "\n".join(lines)


def render_json(checks: Sequence[Check]) -> str:
    return json.dumps(
        {"ok": not any(c.status == FAIL for c in checks),
         "checks": [{"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix} for c in checks]},
        indent=2,
    )


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO, probes: Probes = REAL_PROBES) -> int:
    args = parse_args(argv, env)
    profile = load_site(args.site, env) if args.site else None
    context = make_context(env, args.root, args.offline, profile, args.data_dir, probes)
    checks = run_checks(context)
    print(render_json(checks) if args.json else render_text(checks), file=out)
    return EXIT_FAILED_CHECK if any(c.status == FAIL for c in checks) else 0


def main(argv: Optional[List[str]] = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv, os.environ, sys.stdout)
    except LaunchError as exc:
        print(f"ddp-launch: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
