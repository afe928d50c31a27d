"""The rows a ``gemmrl lib build --generated-only`` merge takes from a new family's runs, chosen so that no cell the
library already serves well is handed to a kernel that was never judged against it (the tiny-family run's two merges).

    python benchmarks/acceptance/library_merge_rows.py remeasured RE.csv[.gz] ... --out ROWS.csv
    python benchmarks/acceptance/library_merge_rows.py screened SEL.csv[.gz] --splice MEASURE.csv[.gz] ... [--supersede LATER ...]
                                           [--margin 1.04] --out ROWS.csv [--shapes-out SHAPES.txt]
    python benchmarks/acceptance/library_merge_rows.py screened SEL.csv[.gz] --splice-md SPLICE.md [--margin 1.04] --out ROWS.csv

``remeasured``: re-measures made beside gemmrl.mm (``gemmrl bench --<family>-from SEL --library LIB``). A cell
(protocol, dtype, acc, shape) is kept only where its ``gemmrl`` row was served by the library's own entry (not
``torch.matmul (entry ... not served ...)``, e.g. a CUTLASS entry on a machine without the headers), so the library
build judges the new kernel against the incumbent in the same run. Where several files hold a cell, the last wins.

``screened``: a ``gemmrl select`` screen (the family's rows beside four cuBLAS paths, no gemmrl.mm column). A cell is
kept where the screen's best verified kernel over its fastest reference beats the library's measured speedup in
that cell (gemmrl / vendor_best of the measure pass, the splice ``--splice`` + ``--supersede`` gives, as
benchmarks/acceptance/library_measure.py reads it) by ``--margin``. ``--splice-md``: the same splice read from the first line of
benchmarks/acceptance/library_measure.py's markdown (``Sources: first, second (supersedes n cells), ...``, file names beside the
markdown): its graph and cold files in order, the first the splice, the rest superseding it. ``--shapes-out``: the
kept cells' shapes, one M_N_K a line, for the measure pass. The measure pass after the merge is what counts.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemmrl.results import read_rows  # noqa: E402
from library_measure import cell, supersede  # noqa: E402
from library_measure import splice_sources as measure_splice_sources  # noqa: E402

REFERENCES = ("cublas_tn", "cublas_nn", "cublaslt_heuristic_tn", "cublaslt_heuristic_nn")


def _by_cell(rows) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(cell(r), []).append(r)
    return out


def remeasured(paths) -> list[dict]:
    """The cells of the re-measures whose gemmrl row the library's entry served (later files win)."""
    kept: dict[tuple, list[dict]] = {}
    for path in paths:
        for key, rs in _by_cell(read_rows([path])).items():
            served = [r for r in rs if r.get("candidate") == "gemmrl" and str(r.get("rep", "0")) in ("", "0")]
            if served and "not served" not in (served[0].get("algo") or ""):
                kept[key] = rs
    return [r for rs in kept.values() for r in rs]


def measured_speedups(measure, later=()) -> dict[tuple, float]:
    """Per cell, gemmrl / vendor_best (vendor_best time over gemmrl time) of a measure pass spliced with later ones."""
    rows = read_rows(list(measure))
    for path in later:
        rows, _ = supersede(rows, read_rows([path]))
    times: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if str(r.get("rep", "0")) in ("", "0") and r.get("candidate") in ("gemmrl", "vendor_best") and r.get("time_ms"):
            times.setdefault(cell(r), {})[r["candidate"]] = float(r["time_ms"])
    return {k: t["vendor_best"] / t["gemmrl"] for k, t in times.items() if len(t) == 2}


def screened(path, speedups: dict[tuple, float], prefix: str, margin: float) -> tuple[list[dict], list[tuple]]:
    """The screen's cells where the family's best verified kernel beats the library's measured speedup by
    ``margin`` (rows of those cells), and (cell, screen ratio, library ratio) for each kept."""
    keep, why = [], []
    for key, rs in _by_cell(read_rows([path])).items():
        ours = [float(r["time_ms"]) for r in rs if r["candidate"].startswith(prefix) and r.get("time_ms")
                and str(r.get("verified")).lower() == "true"]
        refs = [float(r["time_ms"]) for r in rs if r["candidate"] in REFERENCES and r.get("time_ms")]
        if not ours or not refs or key not in speedups:
            continue
        ratio = min(refs) / min(ours)
        if ratio > margin * speedups[key]:
            keep += rs
            why.append((key, ratio, speedups[key]))
    return keep, why


def splice_sources(md: Path) -> list[str]:
    """The graph/cold measure files of a benchmarks/acceptance/library_measure.py splice, in order (first the splice, then the passes
    that supersede it), from its markdown's first line; offline files are left out (no vendor_best rows)."""
    base, later = measure_splice_sources(md)
    paths = [str(p) for p in base + later if "offline" not in p.name]
    if not paths:
        raise SystemExit(f"--splice-md {md}: no graph/cold measure file among its sources")
    return paths


def write(rows: list[dict], out: Path) -> None:
    cols = list(dict.fromkeys(c for r in rows for c in r))
    with open(out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("remeasured")
    r.add_argument("files", nargs="+")
    s = sub.add_parser("screened")
    s.add_argument("screen")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--splice", nargs="+", help="the measure pass's rows (graph, cold)")
    src.add_argument("--splice-md", help="benchmarks/acceptance/library_measure.py's markdown of a splice: its sources instead")
    s.add_argument("--supersede", nargs="*", default=[], help="later passes over some cells, in order")
    s.add_argument("--shapes-out", help="also write the kept cells' shapes here (M_N_K a line)")
    s.add_argument("--prefix", default="tiny:", help="the family's screened candidates")
    s.add_argument("--margin", type=float, default=1.04)
    for p in (r, s):
        p.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.mode == "remeasured":
        rows = remeasured(args.files)
        print(f"{len({cell(x) for x in rows})} cells whose gemmrl row the library's entry served")
    else:
        if args.splice_md:
            if args.supersede:
                ap.error("--splice-md names the superseding passes itself; drop --supersede")
            first, *later = splice_sources(args.splice_md)
            speedups = measured_speedups([first], later)
        else:
            speedups = measured_speedups(args.splice, args.supersede)
        rows, why = screened(args.screen, speedups, args.prefix, args.margin)
        for key, ratio, lib in sorted(why):
            print(f"{' '.join(key)}: screen {ratio:.3f} against the library's {lib:.3f}")
        print(f"{len(why)} cells beat the library by {args.margin}")
        if args.shapes_out:
            shapes = sorted({key[3] for key, *_ in why}, key=lambda m: tuple(int(x) for x in m.split("_")))
            Path(args.shapes_out).write_text("".join(f"{m}\n" for m in shapes))
    if not rows:
        print("nothing to merge", file=sys.stderr)
        return 1
    write(rows, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
