"""Load shared libraries in a child process, as the workers will, and name what is missing.

`ddp-launch doctor` uses it inside the container: the child gets the LD_LIBRARY_PATH
the launcher would set (ld.so reads it only at process start), and a library whose
constructor crashes takes down the child, not the doctor.
"""

import json
import os
import re
import subprocess
import sys
from typing import Mapping, Optional, Sequence, Tuple

# ctypes ORs in RTLD_NOW, so a missing library or symbol shows at dlopen time.
_CHILD = r"""
import ctypes, json, sys
for path in sys.argv[1:]:
    try:
        ctypes.CDLL(path)
        error = ""
    except OSError as exc:
        error = str(exc) or "dlopen failed"
    print(json.dumps([path, error]), flush=True)
"""

# glibc's dlerror() for a dependency it cannot find: "libX.so.N: cannot open shared object file: ..."
_CANNOT_OPEN = re.compile(r"(\S+?): cannot open shared object file")


def missing_library(path: str, message: str) -> Optional[str]:
    """The soname the loader could not find while loading path, or None (path itself, or another error)."""
    match = _CANNOT_OPEN.search(message)
    if not match or match.group(1) == path:
        return None
    return match.group(1)


def load_in_child(paths: Sequence[str], library_path: str,
                  env: Optional[Mapping[str, str]] = None) -> Tuple[Tuple[str, str], ...]:
    """(path, dlopen error or "") for each path, loaded in one child process with LD_LIBRARY_PATH."""
    if not paths:
        return ()
    child_env = dict(os.environ if env is None else env)
    child_env["LD_LIBRARY_PATH"] = library_path
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, *paths], env=child_env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return tuple((path, f"the loading process failed: {exc}") for path in paths)
    results = dict(json.loads(line) for line in done.stdout.splitlines() if line.startswith("["))
    outcome = []
    for path in paths:
        if path in results:
            outcome.append((path, results[path]))
        elif not any(error for _, error in outcome if error.startswith("crashed")):
            # The first path without an answer is the one whose loading killed the child.
            outcome.append((path, f"crashed the loading process (exit status {done.returncode})"))
        else:
            outcome.append((path, "not tried: an earlier library crashed the loading process"))
    return tuple(outcome)
