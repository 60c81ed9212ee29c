"""`python3 -m ddp_contract dataset|download|run-dir-lock ...`: the job scripts' and `make data`'s
commands on the host. Here, not in the package's __init__, so that no module of the package imports
the package that imports it back (tests/unit/launch/test_import_graph.py)."""

import os
import sys
from typing import Iterable, Optional

from ddp_contract import DATASET_DIRNAME, EXIT_USAGE, missing_dataset_files


def main(argv: Optional[Iterable[str]] = None) -> int:
    """`python3 -m ddp_contract dataset DIR`: exit 0 when CIFAR-100 is there, else name what is missing.
    `python3 -m ddp_contract download DIR`: fetch it there (ddp_contract.download; `make data`).
    `python3 -m ddp_contract run-dir-lock DIR`: exit 2 in one line when another job holds DIR.
    `python3 -m ddp_contract resume-check DIR -- FLAGS...`: exit 2 in one line when the run in DIR cannot
    be resumed with those trainer flags (ddp_contract.same_run)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["download"]:
        from ddp_contract import download  # urllib and tarfile only for the download
        return download.main(args[1:])
    if args[:1] == ["resume-check"]:
        from ddp_contract import same_run
        return same_run.main(args[1:])
    if len(args) == 2 and args[0] == "run-dir-lock":
        from ddp_contract import rundir_lock
        return rundir_lock.main(args[1:])
    if len(args) != 2 or args[0] != "dataset":
        print("usage: python3 -m ddp_contract dataset DATA_DIR | download DATA_DIR | run-dir-lock RUN_DIR"
              " | resume-check RUN_DIR -- TRAINER_FLAGS...",
              file=sys.stderr)
        return EXIT_USAGE
    missing = missing_dataset_files(args[1])
    if missing:
        print("{} lacks {}".format(os.path.join(args[1], DATASET_DIRNAME), ", ".join(missing)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
