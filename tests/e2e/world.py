"""The e2e tests' world built ahead of them: the cluster's Debian sid root (apptainer_root.py) and the
test base (e2e_image.py: debootstrap, then torch from the pip sources), side by side.

    python tests/e2e/world.py

`make test` runs this beside the unit suite (tools/run_tests.py). Both are cached under /var/tmp and built
under a lock, so the e2e session finds them built, or waits for the build under way. On a cold machine
they are downloads and unpacking, minutes of one busy core: ahead of the e2e session the other core sat
idle through them; beside the unit suite, its tests fill it. Where they cannot be built (not root, a
tool missing) this says so and stops at 0: the e2e session skips, or names the failure, itself.
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import apptainer_root
import e2e_image as image


def timed(name: str, build: Callable[[], object]) -> tuple[bool, str]:
    """Whether build() built its part, and the line that says so."""
    started = time.monotonic()
    try:
        built = build()
    except image.ImageError as error:
        return False, f"{name}: not built ({error}); the e2e session tries again"
    return True, f"{name}: {built} ({time.monotonic() - started:.0f} s)"


def main() -> int:
    reason = apptainer_root.missing_tools() or image.missing_tools()
    if reason:
        print(f"e2e world: not built ahead: {reason}", flush=True)
        return 0
    parts = {"cluster root": apptainer_root.build, "test base": lambda: image.ensure_base().tag}
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        results = list(pool.map(timed, parts, parts.values()))
    for _, line in results:
        print(f"e2e world: {line}", flush=True)
    return 0 if all(built for built, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
