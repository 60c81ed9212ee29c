"""`python -m ddp_launch.worker (-m MODULE | SCRIPT) [ARGS]`: a workload that dies with its launcher.

Every worker starts through this: it asks Linux for SIGTERM when its parent dies,
then runs the workload exactly as `python -m MODULE ARGS` / `python SCRIPT ARGS`.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time

from ddp_contract import EXIT_USAGE

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# SIGTERM, not SIGKILL: the trainer writes a checkpoint and exits 75 on it.
DEATH_SIGNAL = signal.SIGTERM
# Set by ddp_launch.agent to its own PID: the parent this worker must still have
# once the death signal is armed (see parent_already_gone).
PARENT_PID_VARIABLE = "DDP_LAUNCH_AGENT_PID"
EXIT_ORPHAN = 1
# Rank 0 alone prints a usage error, but torchrun TERMs every other worker as
# soon as one fails: a silent rank that exits 2 first kills rank 0 before it has
# said why. So the others wait this long before they exit 2; once rank 0 has
# exited, torchrun stops them at once, so the wait costs nothing then.
USAGE_GRACE_S = 5.0
USAGE = "usage: python -m ddp_launch.worker (-m MODULE | SCRIPT) [ARGS ...]"


def die_with_parent(signum: int = DEATH_SIGNAL) -> bool:
    """Have the kernel send signum to this process when its parent exits, even by SIGKILL.

    The "parent" is the thread that forked this process (prctl(2)): torchrun
    starts every worker with subprocess.Popen from its agent's main thread
    (SimpleElasticAgent._invoke_run -> LocalElasticAgent._start_workers ->
    SubprocessContext._start, no thread pool), which lives as long as the agent.
    False where there is no prctl: PR_SET_PDEATHSIG is Linux only, and the
    clusters this launcher serves run Linux; elsewhere (a laptop) it is skipped.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def parent_already_gone(expected: str | None, parent: int) -> bool:
    """The launcher died between forking us and die_with_parent(): no signal will ever come.

    Checked after arming, so a death after the check still signals (prctl(2) man
    page, PR_SET_PDEATHSIG: compare getppid() with the creator's PID).
    """
    return bool(expected) and expected.isdigit() and int(expected) != parent


def _say(line: str) -> None:
    # Every rank hits the same problem; one line from global rank 0 is enough.
    if os.environ.get("RANK", "0") == "0":
        print(f"ddp-launch: error: {line}", file=sys.stderr)


def _module_missing(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except ModuleNotFoundError as missing:  # a parent package is missing
        return missing.name is not None and module.startswith(missing.name)


def run_workload(argv: list[str]) -> int:
    """Run the workload in this process the way the python command line would."""
    if not argv or argv == ["-m"]:
        _say(USAGE)
        return EXIT_USAGE
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        if _module_missing(module):
            _say(f"no Python module named {module!r} (--module): check the name, or that the image "
                 f"installs it (python -m pip show)")
            return EXIT_USAGE
        sys.argv = [module, *args]  # run_module puts the module's file in argv[0], as -m does
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    script, args = argv[0], argv[1:]
    if not os.path.isfile(script):
        _say(f"--script {script!r} is not a file on this node (cwd {os.getcwd()})")
        return EXIT_USAGE
    sys.argv = [script, *args]
    # `python SCRIPT` puts the script's directory first on sys.path, not the cwd.
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    runpy.run_path(script, run_name="__main__")
    return 0


def main(argv: list[str] | None = None) -> int:
    die_with_parent()
    expected = os.environ.pop(PARENT_PID_VARIABLE, None)  # not passed on to the workload
    if parent_already_gone(expected, os.getppid()):
        print(f"ddp-launch: error: the launcher (pid {expected}) exited before this worker started: "
              f"not running the workload", file=sys.stderr)
        return EXIT_ORPHAN
    try:
        code = run_workload(sys.argv[1:] if argv is None else argv)
    except SystemExit as stop:
        _let_rank_0_speak(stop.code)
        raise
    _let_rank_0_speak(code)
    return code


def _let_rank_0_speak(code: object) -> None:
    if code == EXIT_USAGE and os.environ.get("RANK", "0") != "0":
        time.sleep(USAGE_GRACE_S)


if __name__ == "__main__":
    sys.exit(main())
