"""make: the real make's dry run (-n) of the given targets, from the directory it is run in.

A dry run reads the Makefile, checks that each target exists and expands its recipe without running
it: the targets the blocks name build images (Apptainer, a base image from a registry) or download
CIFAR-100, which need what this machine lacks (the network, Apptainer 1.3 and fakeroot).
tests/e2e/test_make_build.py runs `make build-*` for real on its offline base.
"""

from __future__ import annotations

import os
import subprocess
import sys

from record import record, refuse

args = sys.argv[1:]
if not args or any(arg.startswith("-") for arg in args):
    refuse(f"make stand-in: give targets (and VAR=value), no options: make {' '.join(args)}", 2)
done = subprocess.run([os.environ["REAL_MAKE"], "-n", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                      text=True)
if done.returncode != 0:
    refuse(done.stderr.strip(), done.returncode)
record("make", args)
