"""The grid-library bar's done-criteria from the measure pass: `gemmrl bench --library` rows (the run that counts, separate from
tuning and selection), chunked and resumed over several calls.

    python benchmarks/acceptance/library_measure.py MEASURE.csv[.gz] ... [--offline OFFLINE.csv[.gz] ...] [--library LIB] [--md OUT.md]
                                     [--plot OUT.png] [--against EARLIER.csv[.gz] ... | --against-splice SPLICE.md]

Per shape class (min(M,N) <= 256, all dims >= 4096, the rest, all) and protocol: the shapes measured, the geomean of
gemmrl's speed over vendor_best (first-run rows; bars 1.05 graph, 1.10 cold over the 1000), its minimum, the
shapes below 0.98 in the first run and the ones that stay below after the noise rule (median of the 3 interleaved
re-measurements `gemmrl bench` makes where gemmrl is > 2% slower), and on how many shapes a generated kernel was
served (the library's choice recorded in the gemmrl row's `algo`: `library.served_desc`). With
--offline: CUDA-L2's statistic, the arithmetic mean over shapes of gemmrl's mean per-call TFLOPS over
cublaslt_autotuned's (the better of tn and nn), bar 1.07. Coverage is counted against the 1000-shape grid. With
--library (the library measured): beside each figure, what the library's selection run said for the same shapes
(library_plot.served: its exact entries' vendor_best / served time), so the winner's curse is in sight.
With --plot: per protocol and dtype, each shape's measured gemmrl / vendor_best against FLOPs, coloured by the family
served, the shapes that stay below 0.98 after the noise rule ringed. With --against (an earlier pass over some of
the same shapes, e.g. before a kernel change): per cell both runs' gemmrl / vendor_best and their ratio (offline
cells too, the new pass's --offline rows against cublaslt_autotuned); --against-splice SPLICE.md: the earlier pass is
the splice a --md of this script names on its first line (its files beside it, superseded in order). With
--supersede LATER.csv ...: a later pass over some shapes (the library rebuilt where only their entries changed)
replaces every row of the cells it measured, (protocol, dtype, acc, shape), in the measure and offline rows alike,
so a figure over the grid is the earlier pass with those cells re-measured, never a mix of two runs in one cell.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemmrl.library import served_desc  # noqa: E402
from gemmrl.report import splice  # noqa: E402
from gemmrl.report.splice import (  # noqa: E402,F401 - the figures and the splice live in the package
    BARS, CLASSES, FLOOR, LABEL, OFFLINE_BAR, REFERENCE, cell, coverage, geomean, markdown, measure_table,
    noise_below, offline_statistic, shape_class, supersede)
from gemmrl.results import read_rows  # noqa: E402
from gemmrl.summary import ratios, table  # noqa: E402


def selection_figures(library_path: str) -> dict[tuple[str, str, str], float]:
    """(protocol, dtype, mnk) -> the library's selection-run speedup over vendor_best at that shape."""
    from gemmrl.library import Library
    from library_plot import served as lib_served

    lib = Library.load(library_path)
    out = {}
    for dtype in {e.dtype for e in lib.entries}:
        for proto, by in lib_served(lib, None, dtype).items():
            for key, (_flops, ratio, _fam) in by.items():
                mnk, *rest = key.split(":")
                if rest and rest[-1] != "fp32":  # fp16-accumulate entries are another mode: gemmrl.mm serves fp32
                    continue
                out[(proto, dtype, mnk)] = ratio
    return out


def measured_points(rows: list[dict], below: set | None = None) -> tuple[dict[str, dict], dict[str, set]]:
    """For --plot: panel ("graph fp16", ...) -> mnk -> (flops, gemmrl / its reference in the first run, family
    served), the reference vendor_best (offline, server: cublaslt_autotuned, CUDA-L2's), and panel -> the shapes
    that stay below 0.98 after the noise rule (``below``: noise_below(rows), if known)."""
    tab = table(rows)
    pts: dict[str, dict] = {}
    for (proto, dtype, _acc, mnk), x in _reference_ratios(rows).items():
        fam = served_desc(tab[(proto, dtype, _acc, mnk)]["gemmrl"]).split(":")[0] or "vendor"
        m, n, k = (int(v) for v in mnk.split("_"))
        pts.setdefault(f"{proto} {dtype}", {})[mnk] = (2.0 * m * n * k, x, fam)
    panels: dict[str, set] = {}
    for mnk, proto, dtype in noise_below(rows) if below is None else below:
        panels.setdefault(f"{proto} {dtype}", set()).add(mnk)
    return pts, panels


def plot(pts: dict, below: dict, path: Path, title: str) -> Path:
    import library_plot

    refs = _references(pts)
    return library_plot.plot(pts, path, title, ylabel=f"{refs[0]} time / gemmrl time" if len(refs) == 1
                             else "reference time / gemmrl time", served_word=" served",
                             ringed=below, ring_label=f"< {FLOOR} after the noise rule", floor=FLOOR)


def _references(panels) -> list[str]:
    """The references of plot panels ("graph fp16", "offline fp16", ...), sorted."""
    return sorted({REFERENCE.get(p.split()[0], "vendor_best") for p in panels})


def _reference_ratios(rows: list[dict]) -> dict[tuple, float]:
    """gemmrl's speed over each cell's reference (first run): vendor_best, or in the host protocols CUDA-L2's
    cublaslt_autotuned (an offline pass may time only that vendor path)."""
    out = {}
    for ref in {"vendor_best", *REFERENCE.values()}:
        out.update({k: x for k, x in ratios(rows, "gemmrl", ref).items() if REFERENCE.get(k[0], "vendor_best") == ref})
    return out


def against(rows: list[dict], old: list[dict]) -> list[dict]:
    """Cell by cell against an earlier measure pass (``old``), over the (protocol, dtype, shape) both measured: each
    run's gemmrl / vendor_best (offline and server: / cublaslt_autotuned) in the first run, what served it in each,
    and new / old. The ratio to each run's own reference is what compares across runs (hosts and runs move absolute
    times by more than a kernel change)."""
    new_r, old_r = _reference_ratios(rows), _reference_ratios(old)
    new_t, old_t = table(rows), table(old)
    out = []
    for k in sorted(set(new_r) & set(old_r), key=lambda k: (k[0] != "graph", k[0], k[1], k[3])):
        out.append({"protocol": k[0], "dtype": k[1], "mnk": k[3], "new": new_r[k], "old": old_r[k],
                    "change": new_r[k] / old_r[k], "served_new": served_desc(new_t[k]["gemmrl"]),
                    "served_old": served_desc(old_t[k]["gemmrl"])})
    return out


def against_markdown(cells: list[dict], sources: list[str]) -> str:
    lines = [f"Against the earlier pass {', '.join(Path(s).name for s in sources)}: gemmrl / vendor_best per cell "
             "(offline, server: / cublaslt_autotuned), each run's own reference", "",
             "| protocol | dtype | cells | geomean now | geomean before | now / before | min | max |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for proto, dtype in sorted({(c["protocol"], c["dtype"]) for c in cells}, key=lambda pd: (pd[0] != "graph", pd)):
        cs = [c for c in cells if (c["protocol"], c["dtype"]) == (proto, dtype)]
        ch = [c["change"] for c in cs]
        lines.append(f"| {proto} | {dtype} | {len(cs)} | {geomean([c['new'] for c in cs]):.4f} | "
                     f"{geomean([c['old'] for c in cs]):.4f} | {geomean(ch):.4f} | {min(ch):.3f} | {max(ch):.3f} |")
    lines += ["", "| protocol | dtype | shape | now | before | now / before | served now | served before |",
              "|---|---|---|---:|---:|---:|---|---|"]
    for c in cells:
        lines.append(f"| {c['protocol']} | {c['dtype']} | {c['mnk']} | {c['new']:.3f} | {c['old']:.3f} | "
                     f"{c['change']:.3f} | {c['served_new'][:90]} | {c['served_old'][:90]} |")
    return "\n".join(lines) + "\n"


def splice_sources(md) -> tuple[list[Path], list[Path]]:
    """The files of a splice this script wrote (``--md``): gemmrl.report.splice.splice_sources, its error an exit."""
    try:
        return splice.splice_sources(md)
    except splice.SpliceError as e:
        raise SystemExit(str(e)) from None


def splice_rows(md) -> list[dict]:
    """Every row of a splice (measure and offline), each superseded cell replaced in order, as main() builds it."""
    return splice.splice_rows_of(*splice_sources(md))  # a bad recipe exits with its message


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("measure", nargs="+", help="gemmrl bench --library rows (graph, cold; shards and chunks)")
    ap.add_argument("--offline", nargs="*", default=[], help="gemmrl bench --library rows in offline")
    ap.add_argument("--library", help="the library measured: its selection-run figures on the same shapes beside")
    ap.add_argument("--against", nargs="*", default=[],
                    help="an earlier measure pass's rows: each shape both measured, now against before")
    ap.add_argument("--against-splice", help="--against, the earlier pass being a splice this script wrote (its .md)")
    ap.add_argument("--supersede", nargs="*", default=[],
                    help="a later pass's rows: each cell it measured replaces the earlier rows of that cell")
    ap.add_argument("--md", help="also write the table as markdown here")
    ap.add_argument("--plot", help="also plot each shape's measured speedup against FLOPs here (PNG; needs matplotlib)")
    args = ap.parse_args(argv)
    rows = read_rows(args.measure)
    off_rows = read_rows(args.offline) if args.offline else []
    sources = args.measure + args.offline
    for path in args.supersede:  # in order: a later file supersedes the earlier ones too
        later = read_rows([path])
        rows, n = supersede(rows, [r for r in later if r["protocol"] not in REFERENCE])
        off_rows, n_off = supersede(off_rows, [r for r in later if r["protocol"] in REFERENCE])
        sources.append(f"{path} (supersedes {n + n_off} cells)")
    below = noise_below(rows)
    recs = measure_table(rows, selection_figures(args.library) if args.library else None, below)
    if args.against and args.against_splice:
        ap.error("give --against ROWS... or --against-splice SPLICE.md, not both")
    if not recs and not off_rows and not (args.against or args.against_splice):
        print("no shape has both a gemmrl and a vendor_best row: is this a `gemmrl bench --library` run?",
              file=sys.stderr)
        return 2
    text = markdown(recs, offline_statistic(off_rows), coverage(rows + off_rows), sources)
    earlier_names = args.against or ([args.against_splice] if args.against_splice else [])
    if earlier_names:
        earlier = splice_rows(args.against_splice) if args.against_splice else read_rows(args.against)
        cells = against(rows + off_rows, earlier)
        if not cells:
            print(f"--against: no (protocol, dtype, shape) with gemmrl and its reference (vendor_best; offline, "
                  f"server: cublaslt_autotuned) in both runs "
                  f"({', '.join(earlier_names)})", file=sys.stderr)
            return 2
        text += "\n" + against_markdown(cells, earlier_names)
    print(text, end="")
    if args.md:
        Path(args.md).write_text(text)
    if args.plot and (recs or off_rows):
        pts, ringed = measured_points(rows + off_rows, below)
        shapes = max(len(v) for v in pts.values())
        mixed = len(_references(pts)) > 1
        print(plot(pts, ringed, Path(args.plot), f"gemmrl bench --library: up to {shapes} grid shapes a panel, "
                   f"{len(set(args.measure + args.offline + args.supersede))} file(s)"
                   + ("; reference vendor_best (offline, server: cublaslt_autotuned)" if mixed else "")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
