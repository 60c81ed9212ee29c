"""The one error type of ddp-bench: a user mistake that cli.main prints as one line (exit 2)."""


class ReportError(Exception):
    """A missing, incomplete or malformed run or CSV file, or an output path that cannot be written."""


def one_line(message: str) -> str:
    """A path may hold a newline; the error must still be one line."""
    return message.replace("\r", "\\r").replace("\n", "\\n")
