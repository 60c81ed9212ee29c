"""argparse for ddp-launch and its subcommands: a bad flag is a LaunchError, so one line and exit 2.

argparse's own error() prints the whole usage and exits; every mistake here is one line.
Python 3.6 compatible: `ddp-launch binds` imports it on the host (host-modules.txt).
"""

import argparse

from ddp_launch.errors import LaunchError


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser whose error() raises LaunchError.

    subcommand: named first in its errors ("binds: unrecognized arguments: --sit");
    hint: added to an unknown-flag error, e.g. where workload flags go.
    """

    def __init__(self, *args, subcommand: str = "", hint: str = "", **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --sit must not quietly mean --site
        super().__init__(*args, **kwargs)
        self.subcommand = subcommand
        self.hint = hint

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments") and self.hint:
            message += f" ({self.hint})"
        raise LaunchError(f"{self.subcommand}: {message}" if self.subcommand else message)
