"""ddp-launch's edge: read the flags and the environment, probe the node, plan, then print or exec the plan.

The reads of os.environ, of the data files (read_fabric_data) and of the node (planner.probe),
the prints and the exec are here; everything between them is pure (planner.parse,
planner.questions, planner.plan).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from ddp_contract import ENV_SOURCES_VAR
from ddp_launch import planner, venv
from ddp_launch.forensics import env_sources
from ddp_launch.errors import LaunchError, run_main
from ddp_launch.fabric.defaults import read_fabric_data
from ddp_launch.options import read_options
from ddp_launch.plan import LaunchPlan

SUBCOMMANDS = ("doctor", "binds", "preflight")
EXIT_CANNOT_EXEC = 127


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    code = run_main(lambda words: venv.run_in_venv(words, os.environ), argv)  # DDP_VENV: exec'd, or on here
    if code:
        return code
    if argv and argv[0] in SUBCOMMANDS:
        return run_main(_subcommand(argv[0]), argv[1:])
    return run_main(launch, argv)


def launch(argv: list[str]) -> int:
    env = dict(os.environ)
    try:
        options = read_options(argv, env)
        parsed = planner.parse(options, env, read_fabric_data(options.site, env))
        plan = planner.plan(parsed, planner.probe(planner.questions(parsed)))
    except LaunchError as error:
        _say_in_run_dir(env, f"ddp-launch: error: {error}")
        raise
    if options.dry_run:
        print(plan.render_json() if options.json else plan.render_text())
        return 0
    return execute(plan, env)


def execute(plan: LaunchPlan, env: dict[str, str]) -> int:
    """Replace this process with the plan's command; returns only when it cannot run."""
    if plan.announcement:
        print(plan.announcement, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        environment = plan.environment(env)
        environment[ENV_SOURCES_VAR] = env_sources(plan)  # for the run's manifest (provenance)
        os.execvpe(plan.argv[0], plan.argv, environment)
    except OSError as error:
        print(f"ddp-launch: error: cannot run {plan.argv[0]!r}: {error.strerror}", file=sys.stderr)
    return EXIT_CANNOT_EXEC


def _say_in_run_dir(env: dict[str, str], line: str) -> None:
    """A job's launcher that stops before its rendezvous leaves its line for the other nodes, which
    would otherwise wait for its store until srun ends them (ddp_contract.launcher_reports)."""
    from ddp_contract import EXIT_USAGE, launcher_reports
    run_dir = env.get(launcher_reports.RUN_DIR_VAR)
    if run_dir:
        import socket
        launcher_reports.write(run_dir, launcher_reports.node_name(env, socket.gethostname()), EXIT_USAGE, line)


def _subcommand(name: str) -> Callable[[list[str]], int | None]:
    """The subcommand's main, or one that says it is not in this build (an image without doctor)."""
    try:
        if name == "doctor":
            from ddp_launch.doctor import main as sub_main
        elif name == "preflight":
            from ddp_launch.preflight import main as sub_main
        else:
            from ddp_launch.binds import main as sub_main
    except ModuleNotFoundError as missing:
        if missing.name != f"ddp_launch.{name}":
            raise

        def sub_main(argv: list[str]) -> int:
            raise LaunchError(f"the {name} subcommand is not in this build (no ddp_launch.{name})")
    return sub_main
