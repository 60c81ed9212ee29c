"""The one error type for a user's mistake, shared by the launcher and the trainer.

Deep code raises LaunchError with a message that names the thing, its value and the fix; each
tool's main() prints it as one line and exits EXIT_USAGE (ddp_launch.errors.run_main). It lives
in the contract because the data files (ddp_contract.data_files) raise it for both packages.
Python 3.6, standard library (host-modules.txt).
"""


class LaunchError(Exception):
    """A problem the user can fix: bad environment, bad flags, missing path, a bad data file."""
