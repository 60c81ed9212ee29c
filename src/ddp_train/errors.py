"""The trainer's one error type for user mistakes, and its exit codes.

Deep code raises TrainError with a message naming the thing and the fix; cli.main
prints it as one line and exits EXIT_USAGE. Anything else is a bug and keeps its traceback.
"""

EXIT_OK = 0
EXIT_FAILURE = 1  # an unexpected exception (a traceback) or a peer rank failing
EXIT_USAGE = 2  # a TrainError: bad flag, missing or corrupt dataset or checkpoint
# Stopped on request (SIGUSR2/SIGUSR1/SIGTERM) after writing a checkpoint: the run is
# unfinished and resumes from <run-dir>/checkpoint.pt. 75 is EX_TEMPFAIL in sysexits.h
# ("temporary failure; the user is invited to retry"), distinct from success, from
# usage errors and from 128+N deaths by signal, so a job script can requeue on it.
EXIT_REQUEUE = 75


class TrainError(Exception):
    """A problem the user can fix: a bad flag, a missing dataset, a corrupt checkpoint."""
