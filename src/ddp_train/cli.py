"""`ddp-train` / `python -m ddp_train`: parse flags, then download or train.

A TrainError (a user mistake) becomes one line `ddp-train: error: ...` on stderr and exit 2;
anything else keeps its traceback. Exit codes are listed in errors.py.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from ddp_train.config import config_from_args
from ddp_train.errors import EXIT_USAGE, TrainError


def _reports_errors(env: "os._Environ[str]") -> bool:
    """Rank 0 and the first rank of every other node print; the rest stay quiet (no 256 copies)."""
    return env.get("RANK", "0") == "0" or env.get("LOCAL_RANK", "0") == "0"


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        config = config_from_args(argv)
        if config.download:
            from ddp_train.download import download_cifar100, refuse_inside_job
            refuse_inside_job(os.environ)
            download_cifar100(config.data_dir)
            return 0
        from ddp_train.train import run  # torch is imported only when training
        return run(config, os.environ)
    except TrainError as exc:
        if _reports_errors(os.environ):
            print(f"ddp-train: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
