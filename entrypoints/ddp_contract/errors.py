"""The one error type for a user's mistake, shared by the launcher and the trainer.

Deep code raises LaunchError with a message that names the thing, its value and the fix; each
tool's main() prints it as one line and exits EXIT_USAGE (ddp_launch.errors.run_main). It lives
in the contract because the data files (ddp_contract.data_files) raise it for both packages.
Python 3.6, standard library (host-modules.txt).
"""


class LaunchError(Exception):
    """A problem the user can fix: bad environment, bad flags, missing path, a bad data file."""


def one_line(message: str) -> str:
    """message as one line of a terminal and of a log: each character that is not printable (a newline,
    a carriage return, the other line breaks str.splitlines() knows, any other control character, an
    undecodable byte of a path) written as its Python escape. A path may hold any of them, and so may the
    error of a library that quotes the bytes of a damaged file (pickle's, for a garbled dataset)."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in message)
