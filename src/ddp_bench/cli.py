"""`ddp-bench report RUN_DIR...`: the scaling table of the MPCDF Raven multi-node tutorial
(github.com/mvigl/MPCDF_tutorial, docs/05_multi_node.md, "Benchmarking All Configurations"),
from the trainer's metrics.

`ddp-bench gpu DIR...` summarises the GPU samplers' CSVs. A ReportError (a missing or malformed file, a bad flag) is one line `ddp-bench: error: ...`
on stderr and exit 2, as for ddp-train.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from ddp_contract import EXIT_USAGE
from ddp_contract.errors import one_line
from ddp_contract.flag_errors import OneLineErrorParser

from ddp_bench import gpumon, report
from ddp_bench.errors import ReportError


class _OneLineErrorParser(OneLineErrorParser):
    """argparse prints usage plus the error; ddp-bench prints one line (exit 2), as ddp-train does."""

    usage_error = ReportError


# Each command's one-line help: its --help and `ddp-bench` alone list them.
COMMANDS = {
    "report": "scaling table (Markdown, CSV, PNG) from run directories",
    "gpu": "mean/min utilisation per GPU (and a PNG) from gpu-<node>.csv files",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(prog="ddp-bench", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", allow_abbrev=False, help=COMMANDS["report"])
    rep.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    rep.add_argument("--out", type=Path, default=Path("bench-report"), help="output dir (default bench-report)")
    gpu = sub.add_parser("gpu", allow_abbrev=False, help=COMMANDS["gpu"])
    gpu.add_argument("paths", nargs="+", type=Path, metavar="CSV_OR_DIR")
    gpu.add_argument("--png", type=Path, default=None, help="plot file (default: gpu-utilisation.png beside the CSVs)")
    return parser


def commands() -> str:
    """What `ddp-bench` alone prints: its commands, one a line."""
    lines = ["usage: ddp-bench COMMAND ...", "commands:", *(f"  {name:<7} {text}" for name, text in COMMANDS.items()),
             "ddp-bench COMMAND --help says more"]
    return "\n".join(lines) + "\n"


def written_line(done: report.Report) -> str:
    first = done.written[0]
    plots = [path.name for path in done.written if path.suffix == ".png"]
    names = ", ".join([str(first), *(path.name for path in done.written[1:])])
    return f"written: {names}" + (f" (the plots: {', '.join(plots)})" if plots else "")


def main(argv: Sequence[str] | None = None) -> int:
    if not (sys.argv[1:] if argv is None else argv):
        print(commands(), end="")
        return 0
    try:
        args = build_parser().parse_args(argv)
        if args.command == "report":
            done = report.report(args.runs, args.out)
            print(done.table, end="")
            for note in done.notes:
                print(f"note: {note}", file=sys.stderr)
            print(written_line(done), file=sys.stderr)
        else:
            print(gpumon.summarise(args.paths, args.png), end="")
    except ReportError as exc:
        print(f"ddp-bench: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
