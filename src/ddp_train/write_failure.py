"""A write into the run dir that failed (checkpoint or metrics), said in one line with its cause.

torch.save's zip writer reports a failed write as RuntimeError "[enforce fail at
inline_container.cc] unexpected pos ...", with the OSError (EFBIG, ENOSPC, EDQUOT) only as
its __context__; the line names the errno, the free space and the file-size limit instead.
"""

from __future__ import annotations

import errno
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ddp_contract import free_bytes

# The errnos a user fixes by making room or raising a limit, with what to do (write(2), ERRORS).
FIXES = {
    errno.ENOSPC: "free space there or pass another --run-dir",
    errno.EDQUOT: "free space within your quota (your site's quota command shows it) or pass another --run-dir",
    errno.EFBIG: "raise the file-size limit (`ulimit -f unlimited` in the job script) or pass another --run-dir",
    errno.EROFS: "the file system went read-only: ask your site, or pass another --run-dir",
    errno.EIO: "the file system reported an I/O error: ask your site, or pass another --run-dir",
    errno.ENOTDIR: "a part of that path is a file, not a directory: pass another --run-dir",
    errno.EEXIST: "a file of that name is in the way of a directory: move it or pass another --run-dir",
    errno.EACCES: "you may not write there: fix its permissions or pass another --run-dir",
}


@dataclass(frozen=True)
class WriteFailure:
    """What is known about a failed write: the OSError under it, if any, and the limits."""
    errno: Optional[int]
    reason: str  # strerror, or the exception's first line when no OSError is underneath
    free_bytes: Optional[int]
    file_size_limit: Optional[int]  # RLIMIT_FSIZE soft limit in bytes; None: unlimited


def underlying_oserror(exc: BaseException) -> Optional[OSError]:
    """The OSError that caused exc: itself, or one in its __cause__ / __context__ chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def describe(exc: BaseException, directory: Path) -> WriteFailure:
    """Read the world once (statvfs, getrlimit) for a failed write into `directory`."""
    os_error = underlying_oserror(exc)
    if os_error is not None:
        reason = os_error.strerror or str(os_error)
    else:
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0][:120]}" if lines else type(exc).__name__
    try:
        free: Optional[int] = free_bytes(str(directory))
    except OSError:
        free = None
    soft, _hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    return WriteFailure(os_error.errno if os_error is not None else None, reason, free,
                        None if soft == resource.RLIM_INFINITY else soft)


def _mib(count: int) -> str:
    return f"{count / 2**20:.1f} MiB"


def message(what: str, path: Path, failure: WriteFailure, kept: str) -> str:
    """One line: what could not be written, why (errno, free space, file-size limit), what is
    unchanged, and the fix."""
    code = f"{errno.errorcode.get(failure.errno, failure.errno)}: " if failure.errno else ""
    facts = [f"{code}{failure.reason}"]
    if failure.free_bytes is not None:
        facts.append(f"{_mib(failure.free_bytes)} free in {path.parent}")
    facts.append("file-size limit (ulimit -f) " + ("unlimited" if failure.file_size_limit is None
                                                   else f"{failure.file_size_limit} bytes"))
    fix = FIXES.get(failure.errno or 0)
    if fix is None:  # no errno: say which of the usual causes this looks like
        fix = ("the file-size limit is the likely cause: raise it (`ulimit -f unlimited`)"
               if failure.file_size_limit is not None else
               "free space there or pass another --run-dir")
    return (f"cannot write the {what} {path} ({'; '.join(facts)}); {kept}: {fix}, "
            f"then run the same command again to resume")
