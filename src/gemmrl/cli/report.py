"""`gemmrl report`: tables, plots, markdown and one HTML page from result CSVs (several: compared on shared shapes).

    gemmrl report benchmarks/results/h100/h100_grid1000_*.csv --out benchmarks/report
    gemmrl report A.csv --compare A.csv B.csv --readme README.md
"""

from __future__ import annotations

from pathlib import Path

from ..results import ResultsError
from .common import CliError


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="tables, plots, markdown and one HTML page from result CSVs")
    r.add_argument("results", nargs="*", metavar="RESULTS.csv", help="result files (several: compared on shared shapes)")
    r.add_argument("--out", default="benchmarks/report", help="directory for report.md, report.html and PNGs")
    r.add_argument("--candidate", help="the candidate reported as ours (default: every non-baseline one present)")
    r.add_argument("--claims", help="CUDA-L2's published per-shape ratios, shown beside ours as claims")
    r.add_argument("--compare", nargs=2, metavar=("A.csv", "B.csv"), help="speed in B / speed in A on shared rows")
    r.add_argument("--readme", help="write the headline tables and two plots into this markdown file, between "
                                    "'<!-- report:begin -->' and '<!-- report:end -->'")
    r.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    from ..report.make import make_report, write_readme_block  # start-up cost: the report writer, not needed by --help

    if not args.results and not args.compare:
        raise CliError("give RESULTS.csv files (and/or --compare A.csv B.csv)")
    missing = [str(p) for p in [*(args.results or []), *(args.compare or [])] if not Path(p).is_file()]
    if missing:
        raise CliError(f"no such file(s): {', '.join(missing)} (give result CSVs of gemmrl bench, select or "
                       "tune --rows-out)")
    try:
        rep = make_report(args.results or [], Path(args.out), candidate=args.candidate, claims=args.claims,
                          compare_files=args.compare)
    except (ResultsError, OSError) as e:
        raise CliError(str(e)) from None
    for note in rep.notes:
        print(f"note: {note}")
    print(f"markdown: {rep.markdown}\nhtml: {rep.html}\nplots: {len(rep.images)} PNG in {rep.out}")
    if args.readme:
        cmd = " ".join(["gemmrl report", *map(str, args.results or []), *(["--candidate", args.candidate]
                                                                          if args.candidate else []),
                        "--out", str(args.out), "--readme", str(args.readme)])
        try:
            write_readme_block(rep, args.readme, cmd)
        except (ResultsError, OSError) as e:
            raise CliError(str(e)) from None
        print(f"readme: {args.readme} (block between the report markers)")
    return 0
