"""module (Lmod, Environment Modules): `module load NAME...`, the only form the docs use.

A real `module` is a shell function that changes the calling shell's environment; this one records
the names, which is what a block can be checked for here.
"""

from __future__ import annotations

import re
import sys

from record import record, refuse

args = sys.argv[1:]
if len(args) < 2 or args[0] != "load" or not all(re.fullmatch(r"[\w.+-]+(/[\w.+-]+)?", name) for name in args[1:]):
    refuse(f"module stand-in: only `module load NAME[/VERSION]...` is known, not `module {' '.join(args)}`")
record("module", args)
