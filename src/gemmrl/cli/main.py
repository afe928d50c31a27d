"""`gemmrl` command line: one entry point, each subcommand a thin shell over a typed function."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..library import LibraryError
from ..problem import ProblemError
from ..results import ResultsError
from . import bench, headroom, lib, report, select, serve_reward, trials, tune, verify, worker
from .common import EXIT_USAGE, CliError


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gemmrl", description=__doc__)
    ap.add_argument("--version", action="version", version=f"gemmrl {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    # in the order `gemmrl --help` lists them (lib adds `lib` and `warmup`)
    for module in (bench, select, verify, report, lib, tune, trials, headroom, worker, serve_reward):
        module.add_parser(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (CliError, ProblemError, ResultsError, LibraryError) as e:  # bad flags or input files
        print(f"gemmrl {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as e:
        from ..measure.bench import BenchError  # start-up cost: the bench, not needed by --help

        if isinstance(e, BenchError):
            print(f"gemmrl {args.cmd}: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        raise
    except KeyboardInterrupt:
        print(f"gemmrl {args.cmd}: interrupted; finished rows are kept, run the same command to resume", file=sys.stderr)
        return 130
