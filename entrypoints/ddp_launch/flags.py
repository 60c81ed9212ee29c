"""argparse for ddp-launch and its subcommands: a bad flag is a LaunchError, so one line and exit 2.

The parser is ddp_contract.flag_errors's, shared with ddp-train and ddp-bench.
Python 3.6 compatible: `ddp-launch binds` imports it on the host (host-modules.txt).
"""

from ddp_contract.flag_errors import OneLineErrorParser
from ddp_launch.errors import LaunchError


class FlagParser(OneLineErrorParser):
    """An ArgumentParser whose error() raises LaunchError (subcommand= and hint=: OneLineErrorParser)."""

    usage_error = LaunchError
