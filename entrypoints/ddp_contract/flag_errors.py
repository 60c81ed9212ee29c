"""argparse whose bad-flag error is an exception, so each tool says it in one line and exits 2.

argparse's own ArgumentParser.error() prints the whole usage, then `PROG: error: MESSAGE`, and
exits 2 (https://docs.python.org/3/library/argparse.html#argparse.ArgumentParser.error). Here
error() raises the tool's own error type instead, and the tool's main() prints it as one line under
its name: `ddp-launch: error: ...`, `ddp-train: error: ...`, `ddp-bench: error: ...`, exit 2.
Python 3.6 compatible: `ddp-launch binds` imports it on the host (host-modules.txt).
"""

import argparse
from typing import Callable


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose error() raises `usage_error(message)`.

    A tool subclasses it and names its error type in `usage_error`; add_subparsers() makes the
    subparsers of the same class, so a subcommand's bad flag raises it too.
    subcommand: named first in its errors ("binds: unrecognized arguments: --sit");
    hint: added to an unknown-flag error, e.g. where workload flags go.
    """

    usage_error = ValueError  # type: Callable[[str], Exception]

    def __init__(self, *args, subcommand: str = "", hint: str = "", **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # --sit must not quietly mean --site
        super().__init__(*args, **kwargs)
        self.subcommand = subcommand
        self.hint = hint

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("unrecognized arguments") and self.hint:
            message += " ({})".format(self.hint)
        raise self.usage_error("{}: {}".format(self.subcommand, message) if self.subcommand else message)
