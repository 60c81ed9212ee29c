"""`ddp-launch doctor`: the preflight a node passes before a big allocation burns on it.

cli (flags, run, main) reads the world once into a context (context.py: site, fabric defaults,
GPU vendor, the launcher's own probe and plan), runs every check of CHECKS (checks.py), each in
its subject's module (launch_plan, storage, gpu, fabric, libraries, nccl_conf, known_issues, network),
and prints the report (report.py); stack.py reads what the workers will load, for nccl_conf and
known_issues. What touches the machine is in probes.py; `--image` runs the build's self-test
instead (self_test.py). gpu_health and image_mount judge what their probes read.
"""

from ddp_launch.doctor.checks import CHECKS, run_checks
from ddp_launch.doctor.cli import EXIT_FAILED_CHECK, library_path_for_workers, main, parse_args, run
from ddp_launch.doctor.context import DoctorContext, make_context
from ddp_launch.doctor.probes import REAL_PROBES, Probes
from ddp_launch.doctor.report import FAIL, OK, SKIP, WARN, Check, render_json, render_text

__all__ = ["CHECKS", "EXIT_FAILED_CHECK", "FAIL", "OK", "REAL_PROBES", "SKIP", "WARN", "Check", "DoctorContext",
           "Probes", "library_path_for_workers", "main", "make_context", "parse_args", "render_json", "render_text",
           "run", "run_checks"]
