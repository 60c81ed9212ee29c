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
from ddp_contract.flag_errors import OneLineErrorParser

from ddp_bench import gpumon, report
from ddp_bench.errors import ReportError, one_line


class _OneLineErrorParser(OneLineErrorParser):
    """argparse prints usage plus the error; ddp-bench prints one line (exit 2), as ddp-train does."""

    usage_error = ReportError


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(prog="ddp-bench", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", allow_abbrev=False, help="scaling table (Markdown, CSV, PNG) from run directories")
    rep.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    rep.add_argument("--out", type=Path, default=Path("bench-report"), help="output dir (default bench-report)")
    gpu = sub.add_parser("gpu", allow_abbrev=False,
                         help="mean/min utilisation per GPU (and a PNG) from gpu-<node>.csv files")
    gpu.add_argument("paths", nargs="+", type=Path, metavar="CSV_OR_DIR")
    gpu.add_argument("--png", type=Path, default=None, help="plot file (default: gpu-utilisation.png beside the CSVs)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "report":
            print(report.report(args.runs, args.out), end="")
            print(f"written: {args.out}/report.md, report.csv, report.png", file=sys.stderr)
        else:
            print(gpumon.summarise(args.paths, args.png), end="")
    except ReportError as exc:
        print(f"ddp-bench: error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
