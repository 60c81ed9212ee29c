"""The one error type for user mistakes, and the one edge that turns it into one line and exit 2.

Deep code raises LaunchError (ddp_contract.errors, which the trainer shares) with a message that
names the thing, its value and the fix. Nothing else is caught, so real bugs still show a traceback.
Python 3.6 compatible: `ddp-launch binds` imports it on the host (host-modules.txt).
"""

import sys
from typing import Callable, List, Optional

from ddp_contract import EXIT_USAGE
from ddp_contract.errors import LaunchError, one_line

__all__ = ["EXIT_USAGE", "LaunchError", "run_main"]


def run_main(main: Callable[[List[str]], Optional[int]], argv: List[str]) -> int:
    """main(argv)'s exit code; a LaunchError becomes one line on stderr and EXIT_USAGE."""
    try:
        return int(main(argv) or 0)
    except LaunchError as error:
        print("ddp-launch: error: {}".format(one_line(str(error))), file=sys.stderr)
        return EXIT_USAGE
