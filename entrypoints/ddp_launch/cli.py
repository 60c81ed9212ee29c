"""ddp-launch's edge: read flags and the environment once, plan, then print or exec the plan.

Everything before this module is pure; here are the only reads of os.environ,
/dev and the name service, the only prints, and the exec.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ddp_launch import __version__
from ddp_launch.errors import EXIT_USAGE, LaunchError
from ddp_launch.flags import FlagParser

SUBCOMMANDS = ("doctor", "binds")
EXIT_CANNOT_EXEC = 127

USAGE = "ddp-launch [options] [-- workload arguments]\n       ddp-launch doctor|binds [...]"
EPILOG = """\
modes (auto detection, in this order):
  torchrun    TORCHELASTIC_RUN_ID set: already a torchrun worker, run the workload
  slurm-task  SLURM_JOB_ID set and more than one task on a node: exec the workload
              per task with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* (env://)
  slurm-node  SLURM_JOB_ID set, one task per node: torchrun per node, c10d rendezvous
  kubeflow    PET_NNODES or PET_MASTER_ADDR set (RunAI, Kubeflow): torchrun per pod
  local       otherwise: torchrun --standalone on this machine

precedence: command line > DDP_LAUNCH_* environment > scheduler environment > default
  DDP_LAUNCH_MODE, DDP_LAUNCH_RDZV_HOST, DDP_LAUNCH_RDZV_PORT, DDP_LAUNCH_SITE,
  DDP_LAUNCH_CPU_WORKERS, DDP_LAUNCH_MAX_RESTARTS, DDP_LAUNCH_RDZV_TIMEOUT (s, default 600),
  DDP_LAUNCH_DNS_TIMEOUT (s, default 120)

rendezvous on SLURM: the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
  as an IPv4 address when it resolves; port 20000 + (job id mod 1000) * 10 + (step id mod 10)

everything after -- goes to the workload unchanged (default workload: python -m ddp_train)
"""


def _help_formatter(prog: str) -> argparse.HelpFormatter:
    # A fixed width: by default argparse imports shutil (and with it bz2, lzma,
    # zlib: ~3 ms of every launch) to measure the terminal, even with no --help.
    return argparse.RawDescriptionHelpFormatter(prog, width=100)


def build_parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="ddp-launch", usage=USAGE, epilog=EPILOG, hint="put workload arguments after --",
                        formatter_class=_help_formatter,
                        description="Turn a scheduler's environment into a correct torchrun launch.")
    add = parser.add_argument
    add("--mode", help="auto (default), slurm-node, slurm-task, kubeflow, torchrun or local")
    add("--nodes", metavar="N", help="expected node count; an error if the scheduler disagrees")
    add("--nproc-per-node", metavar="N", help="workers per node (default: GPUs on the node)")
    add("--cpu-workers", metavar="N", help="N CPU workers per node with gloo (GPUs hidden)")
    add("--rdzv-host", metavar="H", help="rendezvous host (default: the head node / master)")
    add("--rdzv-port", metavar="P", help="rendezvous port (default: derived from the job id)")
    add("--max-restarts", metavar="N", help="torchrun worker-group restarts (default 0)")
    add("--rdzv-timeout", metavar="S", help="seconds to wait for every node to join (torchrun: 600)")
    add("--log-dir", metavar="DIR", help="torchrun's per-worker log directory")
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--module", metavar="MOD", help="run python -m MOD (default ddp_train)")
    workload.add_argument("--script", metavar="PATH", help="run the Python file PATH instead")
    add("--site", metavar="NAME", help="site profile for fabric settings (default: detect)")
    add("--nccl-debug", metavar="LEVEL", help="set NCCL_DEBUG (e.g. INFO) for this run")
    add("--require-fabric", action="store_true", help="fail if the fast interconnect is not usable")
    add("--dry-run", action="store_true", help="print the plan and exit")
    add("--json", action="store_true", help="with --dry-run: print the plan as JSON")
    add("--version", action="version", version=f"ddp-launch {__version__}")
    return parser


def split_workload(argv: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """Launcher flags before the first '--', workload arguments (untouched) after it."""
    if "--" in argv:
        cut = list(argv).index("--")
        return list(argv[:cut]), tuple(argv[cut + 1:])
    return list(argv), ()


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _run_subcommand(name: str, argv: list[str]) -> int:
    try:
        if name == "doctor":
            from ddp_launch.doctor import main as sub_main
        else:
            from ddp_launch.binds import main as sub_main
    except ModuleNotFoundError as missing:
        if missing.name != f"ddp_launch.{name}":
            raise
        print(f"ddp-launch: error: the {name} subcommand is not in this build (no ddp_launch.{name})",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        return int(sub_main(argv) or 0)
    except LaunchError as error:
        print(f"ddp-launch: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _run_subcommand(argv[0], argv[1:])

    # Imported here so that `ddp-launch doctor` does not pay for the planner.
    from dataclasses import replace

    from ddp_launch.fabric import FabricRequest, plan_fabric
    from ddp_launch import gpus
    from ddp_launch.gpus import count_device_files, granted_gpus, require_usable_gpus
    from ddp_launch.modes import build_plan, detect_mode
    from ddp_launch.options import merge_options
    from ddp_launch.rendezvous import lookup_ipv4, waiting_resolver
    from ddp_launch.torchrun import HostFacts

    try:
        launcher_argv, workload_args = split_workload(argv)
        args = build_parser().parse_args(launcher_argv)
        env = dict(os.environ)
        options = merge_options(args, workload_args, env)
        script = options.workload.script
        if script is not None and not os.path.isfile(script):
            raise LaunchError(f"--script {script!r} is not a file: give the path of a Python file "
                              f"(relative paths are taken from {os.getcwd()})")
        if options.mode == "auto":
            options = replace(options, mode=detect_mode(env))
        resolve = lookup_ipv4
        if options.mode == "kubeflow" and not args.dry_run:
            resolve = waiting_resolver(options.dns_timeout_s,
                                       lambda line: print(line, file=sys.stderr, flush=True))
        facts = HostFacts(python=sys.executable, cpu_count=_cpu_count(),
                          device_files=count_device_files("/"))
        plan, topology = build_plan(options, env, facts, resolve)
        if options.mode != "torchrun" and options.cpu_workers is None:
            # Inside torchrun the agent already checked; --cpu-workers is CPU on purpose.
            grant = granted_gpus(env)
            if grant is not None:
                require_usable_gpus(grant, gpus.probe_cuda_driver(), on_kubernetes=options.mode == "kubeflow")
        fabric_env = env
        if options.log_dir and "DDP_LAUNCH_LOG_DIR" not in env:
            # NCCL's transport log goes beside torchrun's per-rank logs.
            fabric_env = {**env, "DDP_LAUNCH_LOG_DIR": options.log_dir}
        fabric = plan_fabric(FabricRequest(
            env=fabric_env,
            multi_node=topology.nodes > 1,
            site=options.site,
            head_address=topology.head_address,
            nccl_debug=options.nccl_debug,
            require_fabric=options.require_fabric,
            gloo=options.cpu_workers is not None,
        ))
        plan = plan.with_env(fabric.changes, fabric.notes)
    except LaunchError as error:
        print(f"ddp-launch: error: {error}", file=sys.stderr)
        return EXIT_USAGE

    if args.dry_run:
        print(plan.render_json() if args.json else plan.render_text())
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(plan.argv[0], plan.argv, plan.environment(env))
    except OSError as error:
        print(f"ddp-launch: error: cannot run {plan.argv[0]!r}: {error.strerror}", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    return EXIT_CANNOT_EXEC  # not reached: exec replaces this process
