"""`gemmrl report`: tables, plots, markdown and one HTML page from result CSVs (several: compared on shared shapes).

    gemmrl report benchmarks/results/h100/h100_grid1000_*.csv --out /tmp/grid-report
    gemmrl report A.csv --compare A.csv B.csv --readme README.md
    gemmrl report --index [--check]      # benchmarks/results/<gpu>/INDEX.csv from the files and the docs citing them
    gemmrl report --readme README.md [--check]   # the README's per-GPU results tables from the indexed files
    gemmrl report --splice SPLICE.md [--check]   # a grid figure built from several runs, from its recipe (report/splice.py)

Without --out the report goes to ./gemmrl-report (never into a committed folder of this repository: inside a checkout
of gemmrl it goes to the user cache instead, $GEMMRL_CACHE_DIR/report).
"""

from __future__ import annotations

from pathlib import Path

from .. import paths
from ..report import index
from ..results import ResultsError
from .common import CliError


def default_out(cwd: Path | None = None) -> Path:
    """./gemmrl-report, unless the current directory is inside a gemmrl checkout (a folder with
    benchmarks/results above it): then the user cache, so a report never lands among committed files."""
    cwd = (cwd or Path.cwd()).resolve()
    if any((d / "benchmarks" / "results").is_dir() and (d / "src" / "gemmrl").is_dir() for d in (cwd, *cwd.parents)):
        return paths.cache_dir("report")
    return cwd / "gemmrl-report"


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="tables, plots, markdown and one HTML page from result CSVs")
    r.add_argument("results", nargs="*", metavar="RESULTS.csv", help="result files (several: compared on shared shapes)")
    r.add_argument("--out", help="directory for report.md, report.html and PNGs (default: ./gemmrl-report; inside a "
                                 "gemmrl checkout the user cache, never the repository)")
    r.add_argument("--candidate", help="the candidate reported as ours (default: every non-baseline one present)")
    r.add_argument("--claims", help="CUDA-L2's published per-shape ratios, shown beside ours as claims")
    r.add_argument("--compare", nargs=2, metavar=("A.csv", "B.csv"), help="speed in B / speed in A on shared rows")
    r.add_argument("--readme", help="with RESULTS.csv: write the headline tables and two plots into this markdown "
                                    "file, between '<!-- report:begin -->' and '<!-- report:end -->'; alone: rebuild "
                                    "its per-GPU results tables ('<!-- gpu-results GPU: FILE... -->' blocks) from "
                                    "the files named there, each indexed in benchmarks/results/GPU/INDEX.csv")
    r.add_argument("--index", action="store_true", help="rewrite benchmarks/results/<gpu>/INDEX.csv (run it in the "
                                                        "repository root after adding result files)")
    r.add_argument("--splice", metavar="SPLICE.md", help="rebuild a figure spliced from several runs: the files its "
                                                         "first line names (Sources: ...), later ones superseding "
                                                         "cells, read again and the figures printed")
    r.add_argument("--check", action="store_true", help="with --index, --splice, or --readme alone: write nothing, "
                                                        "exit 1 where an index, a splice's figures or a results table "
                                                        "is stale")
    r.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from ..report import readme  # start-up cost: the report writer, not needed by --help
    from ..report.make import make_report, write_readme_block  # start-up cost: the report writer, not needed by --help

    if args.index:
        return index.run(Path.cwd(), check=args.check)
    if args.splice:
        return _splice(args.splice, args.check)
    if args.readme and not args.results and not args.compare:
        if not Path(args.readme).is_file():
            raise CliError(f"--readme {args.readme}: no such file (give the README holding the results blocks)")
        try:
            return readme.run(Path.cwd(), Path(args.readme), check=args.check)
        except (ResultsError, OSError) as e:
            raise CliError(str(e)) from None
    if args.check:
        raise CliError("--check goes with --index, --splice SPLICE.md, or --readme FILE and no RESULTS.csv")
    out = Path(args.out) if args.out else default_out()
    if not args.results and not args.compare:
        raise CliError("give RESULTS.csv files (and/or --compare A.csv B.csv)")
    missing = [str(p) for p in [*(args.results or []), *(args.compare or [])] if not Path(p).is_file()]
    if missing:
        raise CliError(f"no such file(s): {', '.join(missing)} (give result CSVs of gemmrl bench, select or "
                       "tune --rows-out)")
    try:
        rep = make_report(args.results or [], out, candidate=args.candidate, claims=args.claims,
                          compare_files=args.compare)
    except (ResultsError, OSError) as e:
        raise CliError(str(e)) from None
    for note in rep.notes:
        print(f"note: {note}")
    for line in rep.verdict:
        print(f"verdict: {line}")
    print(f"markdown: {rep.markdown}\nhtml: {rep.html}\nplots: {len(rep.images)} PNG in {rep.out}")
    if args.readme:
        cmd = " ".join(["gemmrl report", *map(str, args.results or []), *(["--candidate", args.candidate]
                                                                          if args.candidate else []),
                        "--out", str(out), "--readme", str(args.readme)])
        try:
            write_readme_block(rep, args.readme, cmd)
        except (ResultsError, OSError) as e:
            raise CliError(str(e)) from None
        print(f"readme: {args.readme} (block between the report markers)")
    return 0


def _splice(md: str, check: bool) -> int:
    """`gemmrl report --splice MD [--check]`: the figures of a spliced grid figure, rebuilt from its sources."""
    from ..report import splice  # start-up cost: the noise rule's module, not needed by --help

    try:
        if not check:
            print(splice.rebuild(md), end="")
            return 0
        stale = splice.check(md)
    except (splice.SpliceError, ResultsError, OSError) as e:
        raise CliError(str(e)) from None
    for have, again in stale:
        print(f"stale: {md}\n  committed: {have}\n  rebuilt:   {again}")
    if not stale:
        print(f"splice: {md}: every figure rebuilt from its {sum(map(len, splice.splice_sources(md)))} sources")
    return 1 if stale else 0
