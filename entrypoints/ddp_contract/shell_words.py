"""`python3 -m ddp_contract.shell_words PROG NAME VALUE`: a settings variable's words, split by the
shell's quoting rules but with no expansion and no command run (as eval would): shlex.split in
POSIX mode. DDP_TRAIN_ARGS='--compile-cache-dir "/a b"' is two words.

The one rule for every settings variable that holds words: the SLURM job scripts' DDP_TRAIN_ARGS
and DDP_LAUNCH_ARGS (slurm/lib/ddp.sh) and runai/submit.sh's RUNAI_EXTRA_ARGS. It runs on the host
with the node's own python3 (3.6 on SLES 15), so standard library and Python 3.6 only (vermin,
host-modules.txt).

Output: each word NUL-terminated, then one empty word that says the split succeeded (bash 4.4,
SLES 15's, cannot read a process substitution's exit status, so `mapfile -d ''` reads the words
and the caller checks the last one). A value that is not words (an unclosed quote) is one line
`PROG: error: ...` on stderr, exit 2, and no output.
"""

import os
import shlex
import sys
from typing import List, Optional, Sequence

from ddp_contract import EXIT_USAGE


def split_words(name: str, value: str) -> List[str]:
    """VALUE's words; ValueError naming NAME and the fix when its quotes do not close."""
    try:
        return shlex.split(value)
    except ValueError as error:
        raise ValueError("{}={!r} is not words of the shell ({}): close each quote as in the shell, "
                         "e.g. \"a b\"".format(name, value, error)) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        print("usage: python3 -m ddp_contract.shell_words PROG NAME VALUE", file=sys.stderr)
        return EXIT_USAGE
    prog, name, value = args
    try:
        words = split_words(name, value)
    except ValueError as error:
        print("{}: error: {}".format(prog, error), file=sys.stderr)
        return EXIT_USAGE
    # Bytes as they came: a word that is not valid in the locale's encoding (argv decoded it with
    # surrogateescape) goes back out unchanged.
    sys.stdout.flush()
    sys.stdout.buffer.write(b"".join(os.fsencode(word) + b"\0" for word in words) + b"\0")
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
