"""`gemmrl trials`: what a trials store holds, read back without a GPU.

    gemmrl trials export trials.sqlite.gz --run grid1000-part3of5 --rows rows.csv.gz --outcomes outcomes.csv

``export`` writes what ``gemmrl tune --rows-out / --summary-out`` would have written at the end of the run: for a
run that was cut off, or that shared its store with other runs (search/run_export.py).
"""

from __future__ import annotations

from pathlib import Path

from ..search.run_export import ExportError, export_run
from .common import CliError


def add_parser(sub) -> None:
    t = sub.add_parser("trials", help="a trials store read back: a tuning run's rows and outcomes (no GPU)")
    ts = t.add_subparsers(dest="trials_cmd", required=True)
    p = ts.add_parser("export", help="a run's result rows and outcomes, as gemmrl tune --rows-out/--summary-out "
                                     "write them")
    p.add_argument("store", help="a trials store gemmrl tune wrote (.sqlite or .sqlite.gz)")
    p.add_argument("--run", required=True, help="the run's name in the store (gemmrl tune --run)")
    p.add_argument("--rows", help="results CSV of every row the run measured (.csv or .csv.gz)")
    p.add_argument("--outcomes", help="one CSV row per outcome")
    p.add_argument("--gpu", help="GPU model, as the store names it (default: the run's only one)")
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    store = Path(args.store)
    if not store.is_file():
        raise CliError(f"{store}: no such file (give a trials store gemmrl tune wrote, .sqlite or .sqlite.gz)")
    rows, outcomes = (Path(p) if p else None for p in (args.rows, args.outcomes))
    if rows is None and outcomes is None:
        raise CliError("nothing to write: give --rows and/or --outcomes")
    for p in (rows, outcomes):
        if p is not None and p.exists():
            raise CliError(f"{p} exists: give a new path (nothing is overwritten)")
    try:
        got = export_run(store, args.run, rows, outcomes, args.gpu)
    except ExportError as e:
        raise CliError(str(e)) from e
    print(f"{args.run}: {got.shapes} shapes, {got.outcomes} outcomes, {got.rows} rows")
    return 0
