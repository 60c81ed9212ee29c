"""`ddp-launch doctor`: a preflight to run on a node before burning a big allocation.

Prints OK/WARN/FAIL per check with the fix; exit 1 when anything FAILs; --json for machines.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Mapping, Optional, Sequence, TextIO

from ddp_launch.doctor.checks import CHECKS, run_checks
from ddp_launch.doctor.context import make_context
from ddp_launch.doctor.probes import REAL_PROBES, Probes
from ddp_launch.doctor.report import any_failed, render_json, render_text
from ddp_launch.doctor.self_test import IMAGE_CHECKS, self_test_env
from ddp_launch.errors import run_main
from ddp_launch.flags import FlagParser
from ddp_launch.launch_options import DEFAULT_MODULE, Workload
from ddp_launch.sites import load_site

EXIT_FAILED_CHECK = 1


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> argparse.Namespace:
    parser = FlagParser(prog="ddp-launch doctor", subcommand="doctor", hint="see ddp-launch doctor --help",
                        description=__doc__.splitlines()[0])
    parser.add_argument("--offline", action="store_true", help="skip network checks (head node reachability)")
    parser.add_argument("--image", action="store_true",
                        help="only what the image carries (the build's %%test): no GPU, fabric or network checks")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--site", default=env.get("DDP_LAUNCH_SITE"), help="site profile (default: $DDP_LAUNCH_SITE)")
    parser.add_argument("--data-dir", default=env.get("DDP_DATA_DIR", "data"), help="where CIFAR-100 should be")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--script", metavar="PATH", help="the job runs this Python file, not the built-in trainer")
    workload.add_argument("--module", metavar="MOD", help="the job runs python -m MOD, not the built-in trainer")
    parser.add_argument("--root", default="/", help="probe /sys, /dev and /proc under this directory (for tests)")
    parser.add_argument("--known-issues", action="append", default=[], metavar="FILE",
                        help="a file of known-bad stacks of your own, beside containers/sites/known-issues "
                             "(repeatable; DDP_KNOWN_ISSUES names more, ':'-separated)")
    return parser.parse_args(list(argv))


RELAUNCHED = "DDP_DOCTOR_RELAUNCHED"


def library_path_for_workers(context) -> Optional[str]:
    """The LD_LIBRARY_PATH the launch plan gives the workers, when this process lacks it.

    The dynamic loader reads LD_LIBRARY_PATH once, at process start (ld.so(8)), so a
    bound libfabric whose libcxi sits in a planned directory cannot load in a process
    started without it; the checks must run where the workers would.
    """
    # The plan merges the bound directories into the user's value (never replaces it).
    merged = [c.value for c in context.fabric.changes if c.name == "LD_LIBRARY_PATH"]
    if not merged or merged[-1] == context.env.get("LD_LIBRARY_PATH"):
        return None
    return merged[-1]


def relaunch(argv: Sequence[str], env: Mapping[str, str], library_path: str) -> None:
    """Run the doctor again in a fresh interpreter with the workers' library path (the edge)."""
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "ddp_launch", "doctor", *argv],
              {**env, "LD_LIBRARY_PATH": library_path, RELAUNCHED: "1"})


def run(argv: Sequence[str], env: Mapping[str, str], out: TextIO, probes: Probes = REAL_PROBES) -> int:
    args = parse_args(argv, env)
    profile = load_site(args.site, env) if args.site else None
    plan_env = env
    if args.image:
        # At build time (%test, often in a SLURM build job) the scheduler's variables describe
        # the build, not a launch: plan as the runscript would start a local run.
        plan_env = self_test_env(env)
    workload = Workload(module=None, script=args.script) if args.script else Workload(module=args.module or DEFAULT_MODULE)
    context = make_context(plan_env, args.root, args.offline, profile, args.data_dir, probes, workload, args.known_issues)
    library_path = library_path_for_workers(context)
    if library_path is not None and probes is REAL_PROBES and env.get(RELAUNCHED) != "1":
        relaunch(argv, env, library_path)
    checks = run_checks(context, IMAGE_CHECKS if args.image else CHECKS)
    print(render_json(checks) if args.json else render_text(checks), file=out)
    return EXIT_FAILED_CHECK if any_failed(checks) else 0


def main(argv: Optional[List[str]] = None) -> int:
    return run_main(lambda args: run(args, os.environ, sys.stdout), sys.argv[1:] if argv is None else argv)
