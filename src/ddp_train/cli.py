"""`ddp-train` / `python -m ddp_train`: parse flags, then download or train.

A TrainError (a user mistake) becomes one line `ddp-train: error: ...` on stderr and exit 2,
printed once for the whole job (exit_edge.py); anything else keeps its traceback. Exit codes: errors.py.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Mapping, Optional, Sequence

from ddp_train.config import config_from_args
from ddp_train.errors import EXIT_FAILURE, EXIT_USAGE, PeerLost, Seen, TrainError, seen_by
from ddp_train.exit_edge import in_a_job_of_several, leave_now, prints_here, say_once

PROGRAM = "ddp-train"


def _keep_unencodable_output() -> None:
    """A non-UTF-8 path (bytes that decode to surrogates) prints escaped instead of crashing a
    finished run at its summary line (stdout is strict under a UTF-8 locale)."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def _main(argv: Optional[Sequence[str]], env: Mapping[str, str]) -> int:
    try:
        with seen_by(Seen.BY_EVERY_RANK):  # every rank parses the same command line
            config = config_from_args(argv)
        if config.download:
            from ddp_train.download import download_cifar100, refuse_inside_job
            refuse_inside_job(env)
            download_cifar100(config.data_dir)
            return 0
        from ddp_train.train import run  # torch is imported only when training
        return run(config, env)
    except TrainError as exc:
        say_once(PROGRAM, prints_here(exc.seen, env), str(exc), env)
        return EXIT_USAGE
    except PeerLost as exc:  # a node of the job went away: a crash, in one line
        say_once(PROGRAM, exc.prints, str(exc), env)
        return EXIT_FAILURE


def main(argv: Optional[Sequence[str]] = None) -> int:
    _keep_unencodable_output()
    if not in_a_job_of_several(os.environ):
        return _main(argv, os.environ)  # a process of its own: tests call this in-process
    try:
        code = _main(argv, os.environ)
    except Exception:  # a crash keeps its traceback, and its exit code 1 (not -6: exit_edge.leave_now)
        try:
            traceback.print_exc()
        except OSError:  # stderr's file is on a full disk: the exit code still says crash
            pass
        code = EXIT_FAILURE
    leave_now(code)
    return code  # not reached
