"""The one error type of ddp-bench: a user mistake that cli.main prints as one line (exit 2)."""


class ReportError(Exception):
    """A missing, incomplete or malformed run or CSV file, or an output path that cannot be written."""
