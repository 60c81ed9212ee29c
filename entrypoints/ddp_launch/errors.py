"""The one error type for user mistakes; main() turns it into one line and exit 2.

Deep code raises LaunchError with a message that names the thing, its value
and the fix. Nothing else is caught, so real bugs still show a traceback.
"""

EXIT_USAGE = 2


class LaunchError(Exception):
    """A problem the user can fix: bad environment, bad flags, missing path."""
