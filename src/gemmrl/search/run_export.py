"""A tuning run's result rows and outcomes read back from a trials store: what ``gemmrl tune --rows-out /
--summary-out`` write at the end of a run, for a run that was cut off or that shared its store with other runs.

The store is opened read-only in a temporary copy (a ``.gz`` store is unpacked there), so a store that came back
from another machine is never changed. ``gemmrl trials export`` is the command line over :func:`export_run`.
"""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..library import TrialsStore
from ..results import ResultsWriter
from .loop import run_rows, summary_rows, write_summary


class ExportError(ValueError):
    """Nothing to export: the run has no outcomes, or outcomes of several GPU models and none was named."""


@dataclass(frozen=True)
class Exported:
    shapes: int
    outcomes: int
    rows: int


@contextmanager
def open_copy(store_path: Path) -> Iterator[TrialsStore]:
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


def only_gpu(outcomes: list[dict], gpu: str | None, what: str) -> str:
    """``gpu``, or the only GPU model among ``outcomes``; ExportError naming ``what`` when there are none or several."""
    if gpu is not None:
        return gpu
    gpus = sorted({o["gpu"] for o in outcomes})
    if len(gpus) != 1:
        raise ExportError(f"{what} has outcomes of {len(gpus)} GPU models ({', '.join(gpus) or 'none'}); "
                          "name one with --gpu")
    return gpus[0]


def _write_rows(rows: list[dict], out: Path) -> None:
    if not str(out).endswith(".gz"):
        ResultsWriter(out).write_batch(rows)
        return
    plain = out.with_suffix("")
    ResultsWriter(plain).write_batch(rows)
    with open(plain, "rb") as src, gzip.open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


def export_run(store_path: Path, run: str, rows_out: Path | None = None, outcomes_out: Path | None = None,
               gpu: str | None = None) -> Exported:
    """Write run ``run``'s result rows (a results CSV, ``.csv.gz`` gzipped) and its outcomes (one CSV row each)
    where asked; ExportError when the store has no such run, or nothing of it on that GPU."""
    with open_copy(store_path) as store:
        outcomes = store.outcomes(run=run)
        if not outcomes:
            runs = sorted({o["run"] for o in store.outcomes()})
            raise ExportError(f"{store_path}: no run {run!r}; the store holds {', '.join(runs) or 'no run'} "
                              "(give one of these to --run)")
        gpu = only_gpu(outcomes, gpu, f"{store_path}: run {run!r}")
        summary = summary_rows(store, gpu, run)
        if not summary:
            raise ExportError(f"{store_path}: no outcomes of run {run!r} on {gpu!r}")
        rows = run_rows(store, gpu, run)
    if outcomes_out:
        write_summary(summary, outcomes_out)
    if rows_out:
        _write_rows(rows, rows_out)
    return Exported(len({r["mnk"] for r in summary}), len(summary), len(rows))
