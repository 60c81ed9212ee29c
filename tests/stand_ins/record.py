"""Stand-ins for the cluster tools that the documentation's command blocks call (sbatch, make,
module, kubectl), for the unit tests that run those blocks as written
(tests/unit/containers/test_command_blocks.py). Each takes only what its tool documents, checks
what the tool would check, records its call here, and refuses anything else with the tool's own
error and exit status.
"""

from __future__ import annotations

import json
import os
import sys


def record(tool: str, argv: list, **details) -> None:
    """One JSON line, {"tool", "argv", "cwd", ...}, appended to $STAND_IN_CALLS."""
    with open(os.environ["STAND_IN_CALLS"], "a") as calls:
        json.dump({"tool": tool, "argv": argv, "cwd": os.getcwd(), **details}, calls)
        calls.write("\n")


def refuse(message: str, status: int = 1) -> None:
    print(message, file=sys.stderr)
    sys.exit(status)
