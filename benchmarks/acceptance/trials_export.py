"""A tuning run's result rows and outcomes, read back from a trials store (what `gemmrl tune --rows-out /
--summary-out` write at the end of a run, for a run that was cut off or tuned several parts in one call).

    python benchmarks/acceptance/trials_export.py STORE.sqlite[.gz] --run grid1000-part3of5 --rows ROWS.csv[.gz] --outcomes OUT.csv

The store is opened read-only in a copy (a .gz is unpacked to a temporary file); the GPU is the only one of the run's
outcomes unless --gpu names it. Prints how many shapes, outcomes and rows the run has.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.library import TrialsStore  # noqa: E402
from gemmrl.results import ResultsWriter  # noqa: E402
from gemmrl.search.loop import run_rows, summary_rows, write_summary  # noqa: E402


@contextmanager
def open_copy(store_path: Path):
    """The trials store at ``store_path`` opened in a temporary copy (a .gz unpacked), closed and removed after."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "trials.sqlite"
        if store_path.suffix == ".gz":
            with gzip.open(store_path, "rb") as src, open(copy, "wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(store_path, copy)
        store = TrialsStore(copy)
        try:
            yield store
        finally:
            store.close()


def only_gpu(outs: list[dict], gpu: str | None, what: str) -> str:
    """``gpu``, or the only GPU model among ``outs``; SystemExit naming ``what`` when there are none or several."""
    if gpu is not None:
        return gpu
    gpus = sorted({o["gpu"] for o in outs})
    if len(gpus) != 1:
        raise SystemExit(f"{what} has outcomes of {len(gpus)} GPU models ({', '.join(gpus) or 'none'}); "
                         "name one with --gpu")
    return gpus[0]


def export(store_path: Path, run: str, rows_out: Path | None, outcomes_out: Path | None, gpu: str | None = None,
           ) -> tuple[int, int, int]:
    """(shapes, outcomes, rows) of ``run``, written where asked; SystemExit with a message when there is nothing."""
    with open_copy(store_path) as store:
        gpu = only_gpu(store.outcomes(run=run), gpu, f"{store_path}: run {run!r}")
        summary = summary_rows(store, gpu, run)
        if not summary:
            raise SystemExit(f"{store_path}: no outcomes of run {run!r} on {gpu!r}")
        rows = run_rows(store, gpu, run)
    if outcomes_out:
        write_summary(summary, outcomes_out)
    if rows_out:
        if str(rows_out).endswith(".gz"):
            plain = rows_out.with_suffix("")
            ResultsWriter(plain).write_batch(rows)
            with open(plain, "rb") as src, gzip.open(rows_out, "wb") as dst:
                shutil.copyfileobj(src, dst)
            plain.unlink()
        else:
            ResultsWriter(rows_out).write_batch(rows)
    return len({r["mnk"] for r in summary}), len(summary), len(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store", type=Path)
    ap.add_argument("--run", required=True)
    ap.add_argument("--rows", type=Path, help="results CSV of every row the run measured (.csv or .csv.gz)")
    ap.add_argument("--outcomes", type=Path, help="one CSV row per outcome")
    ap.add_argument("--gpu", help="GPU model, as the store names it (default: the run's only one)")
    args = ap.parse_args(argv)
    if not args.store.is_file():
        ap.error(f"{args.store}: no such file (a trials store gemmrl tune wrote, .sqlite or .sqlite.gz)")
    for p in (args.rows, args.outcomes):
        if p is not None and p.exists():
            ap.error(f"{p} exists: give a new path (nothing is overwritten)")
    shapes, outcomes, rows = export(args.store, args.run, args.rows, args.outcomes, args.gpu)
    print(f"{args.run}: {shapes} shapes, {outcomes} outcomes, {rows} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
