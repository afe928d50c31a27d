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
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemmrl.measure.bench import noise_rule_below  # noqa: E402
from gemmrl.library import served_desc  # noqa: E402
from gemmrl.problem import grid  # noqa: E402
from gemmrl.results import read_rows  # noqa: E402
from gemmrl.summary import ratios, table  # noqa: E402

CLASSES = ("small", "other", "large", "all")
LABEL = {"small": "min(M,N) <= 256", "other": "the rest", "large": "all dims >= 4096", "all": "all"}
BARS = {"graph": 1.05, "cold": 1.10}
FLOOR = 0.98  # no shape below this (noise rule)
OFFLINE_BAR = 1.07


def shape_class(mnk: str) -> str:
    m, n, k = (int(x) for x in mnk.split("_"))
    if min(m, n) <= 256:
        return "small"
    if min(m, n, k) >= 4096:
        return "large"
    return "other"


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


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


def noise_below(rows: list[dict]) -> set[tuple[str, str, str]]:
    """(mnk, protocol, dtype) where gemmrl stays below 0.98 of vendor_best after the noise rule (a rule per dtype)."""
    return {(mnk, proto, dtype) for dtype in {r["dtype"] for r in rows}
            for mnk, proto in noise_rule_below([r for r in rows if r["dtype"] == dtype], "gemmrl", "vendor_best",
                                               margin=1 - FLOOR)}


def measure_table(rows: list[dict], selection: dict | None = None, below: set | None = None) -> list[dict]:
    """One record per (protocol, dtype, class): the measure pass's figures against vendor_best (and, given the
    library's ``selection`` figures, their geomean over the same shapes). ``below``: noise_below(rows), if known."""
    rat = ratios(rows, "gemmrl", "vendor_best")
    tab = table(rows)
    below = noise_below(rows) if below is None else below
    out = []
    for proto, dtype in sorted({k[:2] for k in rat}, key=lambda pd: (pd[0] != "graph", pd[0], pd[1] != "fp16", pd[1])):
        for cls in CLASSES:
            keys = [k for k in rat if k[:2] == (proto, dtype) and (cls == "all" or shape_class(k[3]) == cls)]
            if not keys:
                continue
            xs = [rat[k] for k in keys]
            gen_keys = [k for k in keys if (what := served_desc(tab[k]["gemmrl"])) and not what.startswith("vendor:")]
            gen, is_gen = len(gen_keys), set(gen_keys)
            stays = sorted(k[3] for k in keys if (k[3], proto, dtype) in below)
            out.append({"protocol": proto, "dtype": dtype, "class": cls, "shapes": len(keys), "geomean": geomean(xs),
                        "min": min(xs), "first_below": sum(x < FLOOR for x in xs), "noise_below": len(stays),
                        "below_shapes": stays, "generated": gen, "bar": BARS.get(proto) if cls == "all" else None,
                        "generated_geomean": geomean([rat[k] for k in gen_keys]),
                        "vendor_geomean": geomean([rat[k] for k in keys if k not in is_gen])})
            if selection is not None:
                sel = [selection[(proto, dtype, k[3])] for k in keys if (proto, dtype, k[3]) in selection]
                out[-1]["selection"] = geomean(sel) if len(sel) == len(keys) else math.nan
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


def offline_statistic(rows: list[dict]) -> dict | None:
    """CUDA-L2's offline statistic over the shapes where both gemmrl and cublaslt_autotuned ran."""
    rat = {k: v for k, v in ratios(rows, "gemmrl", "cublaslt_autotuned").items() if k[0] == "offline"}
    if not rat:
        return None
    xs = list(rat.values())
    return {"shapes": len(xs), "mean": statistics.fmean(xs), "geomean": geomean(xs), "min": min(xs)}


REFERENCE = {"offline": "cublaslt_autotuned", "server": "cublaslt_autotuned"}  # CUDA-L2's; else vendor_best


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


def coverage(rows: list[dict]) -> dict[str, int]:
    """Grid shapes with a usable gemmrl row, per protocol."""
    on_grid = {p.mnk for p in grid()}
    seen: dict[str, set] = {}
    for (proto, _d, _a, mnk), by in table(rows).items():
        if "gemmrl" in by and mnk in on_grid:
            seen.setdefault(proto, set()).add(mnk)
    return {p: len(s) for p, s in seen.items()}


def _fmt(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.4f}"


def markdown(recs: list[dict], off: dict | None, cov: dict[str, int], sources: list[str]) -> str:
    lines = [f"Sources: {', '.join(Path(s).name for s in sources)}", "",
             "Coverage of the 1000-shape grid: " + ", ".join(f"{p} {n}" for p, n in sorted(cov.items())), "",
             "| protocol | dtype | class | shapes | geomean gemmrl / vendor_best | bar | selection run, same shapes | min "
             "| below 0.98 first run | below 0.98 after the noise rule | generated served | geomean where generated serves "
             "| geomean where a vendor path serves |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in recs:
        bar = f"{r['bar']:.2f}" if r["bar"] else ""
        sel = "" if "selection" not in r else ("(not all in the library)" if math.isnan(r["selection"])
                                               else f"{r['selection']:.4f}")
        lines.append(f"| {r['protocol']} | {r['dtype']} | {LABEL[r['class']]} | {r['shapes']} | {r['geomean']:.4f} | "
                     f"{bar} | {sel} | {r['min']:.3f} | {r['first_below']} | {r['noise_below']} | {r['generated']} | "
                     f"{_fmt(r['generated_geomean'])} | {_fmt(r['vendor_geomean'])} |")
    stays = [(r["protocol"], r["dtype"], s) for r in recs if r["class"] == "all" for s in r["below_shapes"]]
    if stays:
        lines += ["", "Below 0.98 after the noise rule: " + ", ".join(f"{s} ({p} {d})" for p, d, s in stays)]
    if off:
        lines += ["", f"offline, CUDA-L2's statistic over {off['shapes']} shapes (arithmetic mean of gemmrl / "
                      f"cublaslt_autotuned, mean per-call TFLOPS): {off['mean']:.4f} (bar {OFFLINE_BAR}); geomean "
                      f"{off['geomean']:.4f}, min {off['min']:.3f}"]
    return "\n".join(lines) + "\n"


def cell(r: dict) -> tuple[str, str, str, str]:
    return r["protocol"], r["dtype"], r["acc"], r["mnk"]


def supersede(rows: list[dict], later: list[dict]) -> tuple[list[dict], int]:
    """``rows`` with every cell (protocol, dtype, acc, shape) that ``later`` has rows of replaced by those rows
    (first runs and rechecks alike), and how many cells were replaced; later cells the earlier rows lack are added."""
    cells = {cell(r) for r in later}
    kept = [r for r in rows if cell(r) not in cells]
    return kept + later, len(cells & {cell(r) for r in rows})


def splice_sources(md) -> tuple[list[Path], list[Path]]:
    """The files of a splice this script wrote (``--md``), from its first line ``Sources: a, b (supersedes n cells),
    ...``, resolved beside the markdown: (the earlier passes, measure and offline; the superseding ones, in order)."""
    md = Path(md)
    if not md.is_file():
        raise SystemExit(f"{md}: no such file; give the markdown benchmarks/acceptance/library_measure.py --md wrote")
    first = (md.read_text().splitlines() or [""])[0]
    if not first.startswith("Sources: "):
        raise SystemExit(f"{md}: no 'Sources: ...' first line; give the markdown benchmarks/acceptance/library_measure.py --md wrote")
    base, later = [], []
    for entry in first[len("Sources: "):].split(", "):
        name, sep, _ = entry.strip().partition(" (supersedes ")
        (later if sep else base).append(md.parent / Path(name).name)
    missing = [str(p) for p in base + later if not p.exists()]
    if missing:
        raise SystemExit(f"{md}: its sources are not beside it: {', '.join(missing)}")
    return base, later


def splice_rows(md) -> list[dict]:
    """Every row of a splice (measure and offline), each superseded cell replaced in order, as main() builds it."""
    base, later = splice_sources(md)
    rows = read_rows([str(p) for p in base])
    for path in later:
        rows, _ = supersede(rows, read_rows([str(path)]))
    return rows


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
