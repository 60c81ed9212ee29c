"""Follow argv through the trainer, from `ddp_train.cli.main` to the epoch loop, and count the rooms.

A reader who follows a run's command line through the code enters a file, leaves it for another, and
comes back: each return to a file already left is one more place to hold in mind. This runs a real,
tiny, one-process training run (generated CIFAR-format data, the CPU) under sys.setprofile, follows
the file that holds the running frame of our own code (src/ddp_train and entrypoints/ddp_contract),
and stops at the first epoch's progress bar, where the epoch loop begins. It prints:

  files entered   the distinct files the walk went through
  returns         the times it came back to a file it had left before (A -> B -> A counts one), and
                  how many of them are an import's: a move into or out of a module's top level
                  (the trainer's modules load after the flags are parsed, so that --help and a flag
                  error need no torch: each module loaded costs two moves wherever it is imported)
  the walk        each file in the order entered, with how many times it was entered

Library calls (torch, argparse) are skipped: the walk is of our code. Run it on two checkouts to
compare them: `python benchmarks/argv_walk.py` (the checkout's own src/ and entrypoints/ come first).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OURS = (REPO / "src" / "ddp_train", REPO / "entrypoints" / "ddp_contract")


class EpochLoopReached(Exception):
    """Raised by the profiler at the first epoch's progress bar: the walk ends there."""


def ours(filename: str) -> str | None:
    path = Path(filename)
    for root in OURS:
        if path.is_relative_to(root):
            return str(path.relative_to(root.parent))
    return None


def walk(argv: list[str]) -> tuple[list[str], list[bool]]:
    """The files of our code in the order the running frame moved through them, consecutive repeats
    folded, from cli.main until the epoch loop starts; and for each move, whether an import made it
    (it enters a module's top level, or comes back from one)."""
    from ddp_train import cli

    trail: list[str] = []
    loading: list[bool] = []
    stack: list[str | None] = []

    def enter(name: str | None, by_import: bool) -> None:
        if name is not None and (not trail or trail[-1] != name):
            trail.append(name)
            loading.append(by_import)

    def profile(frame, event, _arg):
        by_import = frame.f_code.co_name == "<module>"
        if event == "call":
            name = ours(frame.f_code.co_filename)
            if name is not None and frame.f_code.co_name == "__init__" and name.endswith("progress.py"):
                raise EpochLoopReached
            stack.append(name)
            enter(name, by_import)
        elif event == "return" and stack:
            stack.pop()
            # Back in the caller: the innermost frame of ours that is still running.
            enter(next((name for name in reversed(stack) if name is not None), None), by_import)

    sys.setprofile(profile)
    try:
        cli.main(argv)
    except EpochLoopReached:
        pass
    finally:
        sys.setprofile(None)
    return trail, loading


def return_moves(trail: list[str]) -> list[int]:
    """The moves (indices into trail) that come back to a file left before."""
    left: set[str] = set()
    returns = []
    for index in range(1, len(trail)):
        left.add(trail[index - 1])
        if trail[index] in left:
            returns.append(index)
    return returns


def figures(trail: list[str]) -> tuple[int, int]:
    return len(set(trail)), len(return_moves(trail))


def returns_by_import(trail: list[str], loading: list[bool]) -> int:
    """How many of figures()'s returns an import made (walk's `loading` flags, one per move)."""
    return sum(loading[index] for index in return_moves(trail))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print the walk, file by file")
    args = parser.parse_args()
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "GROUP_RANK"):
        os.environ.pop(name, None)  # a world of one, in this process
    from ddp_train import synthetic  # noqa: F401  (imported before the walk, not counted in it)

    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "data"
        synthetic.write_dataset(data, train=64, test=16, seed=2)
        trail, loading = walk(["--data-dir", str(data), "--run-dir", str(Path(scratch) / "run"), "--device", "cpu",
                      "--allow-unverified-data", "--batch-size", "32", "--width-scale", "0.0625", "--epochs", "1"])
    entered, returns = figures(trail)
    print(f"argv -> epoch loop: {entered} files entered, {returns} returns to a file already left "
          f"({len(trail)} moves)")
    by_import = returns_by_import(trail, loading)
    print(f"  of the returns, {by_import} are imports' (modules loaded) and {returns - by_import} calls'")
    if args.show:
        for name, count in Counter(trail).most_common():
            print(f"  {count:3d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
