"""The Triton-family, CUTLASS-family and grid-library bars' speed bars beside the room the vendor leaves (gemmrl headroom), as markdown.

    python benchmarks/acceptance/headroom_table.py --headroom H.csv [H2.csv ...] [--ours REMEASURE.csv ...] --out table.md

Per class and protocol: the geomean headroom (the best speedup over the vendor paths timed beside the probe that any
GEMM could reach, headroom.py), the issue's bar, and whether the bar is excluded (geomean headroom < bar). With
``--ours`` (re-measure CSVs of gemmrl bench with Triton/CUTLASS candidates): our best candidate per shape against the
vendor_best of that run, and as a share of the measured speed of light (t_sol / t_ours: 1.0 = at the bound).
The groups of shapes follow the issues: the Triton-family bar's 120 (decode + grid sample), the CUTLASS-family bar's 100 grid shapes, the grid.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.measure.headroom import CLASSES, bounds, by_class, geomean  # noqa: E402
from gemmrl.results import read_rows  # noqa: E402
from gemmrl.summary import best_of, usable  # noqa: E402

BARS = {  # (issue, class, protocol) -> bar over vendor_best
    ("3", "min(M,N) <= 256", "cold"): 1.10, ("3", "min(M,N) <= 256", "graph"): 1.05,
    ("3", "all dims >= 4096", "cold"): 0.97, ("3", "all dims >= 4096", "graph"): 0.97,
    ("4", "all", "cold"): 1.05, ("4", "all", "graph"): 1.05,
    ("5", "all", "cold"): 1.10, ("5", "all", "graph"): 1.05,
}
DECODE_M = (1, 8, 16, 32)


def ours_best(paths: list[str]) -> dict[tuple[str, str], tuple[float, float, str]]:
    """(mnk, protocol) -> (our best verified time, that run's vendor_best time, our candidate's name), from the first
    file that holds the shape (runs are never mixed: a minimum over two runs would be biased)."""
    out: dict = {}
    for path in paths:
        for k, v in _ours_best_one(path).items():
            out.setdefault(k, v)
    return out


def _ours_best_one(path: str) -> dict[tuple[str, str], tuple[float, float, str]]:
    rows = read_rows([path])
    vb = {(r["mnk"], r["protocol"]): float(r["time_ms"]) for r in rows if r["candidate"] == "vendor_best" and usable(r)}
    out: dict[tuple[str, str], tuple[float, float, str]] = {}
    for family in ("triton", "cutlass"):
        for (proto, mnk), r in best_of(rows, family).items():
            t = float(r["time_ms"])
            if (mnk, proto) in vb and t < out.get((mnk, proto), (math.inf,))[0]:
                out[(mnk, proto)] = (t, vb[(mnk, proto)], r["candidate"])
    return out


def section(title: str, bs: list, issue: str, ours: dict) -> list[str]:
    lines = [f"### {title}", "",
             "| class | protocol | shapes | geomean headroom | min | max | bar | bar excluded | bar's share of the "
             "room (log) | ours vs vendor_best | ours / speed of light |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for h in by_class(bs, CLASSES):
        bar = BARS.get((issue, h.cls, h.protocol))
        sel = [b for b in bs if b.protocol == h.protocol and CLASSES[h.cls](b)]
        mine = [ours[(b.mnk, b.protocol)] for b in sel if (b.mnk, b.protocol) in ours]
        vs = f"{geomean([vb / t for t, vb, _ in mine]):.3f} ({len(mine)})" if mine else ""
        sol = {(b.mnk, b.protocol): b.sol_ms for b in sel}
        frac = [sol[(b.mnk, b.protocol)] / ours[(b.mnk, b.protocol)][0] for b in sel if (b.mnk, b.protocol) in ours]
        fr = f"{geomean(frac):.3f}" if frac else ""
        if bar is None:
            excl, share = "", ""
        else:
            excl = "**yes**" if h.geomean < bar else "no"
            share = f"{math.log(bar) / math.log(h.geomean):.2f}" if h.geomean > 1 and bar > 1 else ""
        lines.append(f"| {h.cls} | {h.protocol} | {h.n} | {h.geomean:.3f} | {h.lo:.3f} | {h.hi:.3f} | "
                     f"{'' if bar is None else bar} | {excl} | {share} | {vs} | {fr} |")
    lines.append("")
    return lines


def extremes(bs: list, n: int = 10) -> list[str]:
    lines = ["### Where the room is, and where there is none", ""]
    for proto in sorted({b.protocol for b in bs}):
        sel = sorted((b for b in bs if b.protocol == proto), key=lambda b: b.headroom)
        for name, part in (("least", sel[:n]), ("most", sel[-n:][::-1])):
            lines += [f"{proto}, {name} room:", "", "| shape | vendor (us) | path | probe (us) | probe GB/s | "
                      "mma at clock ceiling (us) | headroom | bound by |", "|---|---:|---|---:|---:|---:|---:|---|"]
            for b in part:
                lines.append(f"| {b.mnk} | {b.t_vendor_ms * 1e3:.2f} | {b.vendor} | {b.t_touch_ms * 1e3:.2f} | "
                             f"{b.touch_gbs:.0f} | {b.t_mma_ms * 1e3:.2f} | {b.headroom:.3f} | {b.limit} |")
            lines.append("")
    return lines


def plot(bs: list, ours: dict, path: str) -> None:
    """Per protocol: each shape's headroom against its FLOPs (log-log), coloured by class, and where ``ours`` has the
    shape, our selection's speedup over vendor_best in its own re-measure (runs are not mixed)."""
    from gemmrl.report.plots import _plain, _plt, _save

    plt = _plt()
    protos = sorted({b.protocol for b in bs})
    fig, axes = plt.subplots(1, len(protos), figsize=(6.5 * len(protos), 4.6), squeeze=False)
    colours = {"min(M,N) <= 256": "tab:blue", "all dims >= 4096": "tab:red", "other": "tab:green"}
    for ax, proto in zip(axes[0], protos):
        sel = [b for b in bs if b.protocol == proto]
        for cls, col in colours.items():
            part = [b for b in sel if CLASSES[cls](b)]
            ax.scatter([2 * b.M * b.N * b.K for b in part], [b.headroom for b in part], s=14, c=col, alpha=0.75,
                       label=f"bound, {cls} ({len(part)})")
        mine = [(2 * b.M * b.N * b.K, ours[(b.mnk, proto)][1] / ours[(b.mnk, proto)][0]) for b in sel
                if (b.mnk, proto) in ours]
        if mine:
            ax.scatter(*zip(*mine), s=14, marker="x", c="k", alpha=0.7,
                       label=f"our selection vs vendor_best, its own run ({len(mine)})")
        ax.axhline(1.0, c="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain(ax.yaxis)
        ax.set_xlabel("FLOPs (2MNK)")
        ax.set_ylabel("speedup over the vendor paths timed beside the probe")
        ax.set_title(f"{proto}: the most any GEMM could gain (H100)")
        ax.legend(fontsize=7, loc="upper right")
    _save(fig, Path(path))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--headroom", nargs="+", required=True, help="CSVs of gemmrl headroom")
    ap.add_argument("--ours", nargs="*", default=[], help="re-measure CSVs of our families (gemmrl bench); per shape "
                                                          "the first file that holds it counts")
    ap.add_argument("--out", help="markdown file (default: stdout)")
    ap.add_argument("--plot", help="PNG of the first --headroom file's bounds per shape (needs matplotlib)")
    args = ap.parse_args()
    out = ["## Headroom: the room the vendor leaves, beside the issues' bars", ""]
    ours = ours_best(args.ours) if args.ours else {}
    for path in args.headroom:
        bs = bounds(read_rows([path]))
        if not bs:
            print(f"{path}: no (shape, protocol) with both a verified vendor row and a probe row", file=sys.stderr)
            return 2
        name = Path(path).name
        decode = [b for b in bs if b.M in DECODE_M]
        grid = [b for b in bs if b.M not in DECODE_M]
        n_shapes = len({b.mnk for b in bs})
        if decode and grid:
            out += section(f"{name}: all {n_shapes} shapes (the Triton-family bar's classes and bars)", bs, "3", ours)
            out += section(f"{name}: the {len({b.mnk for b in grid})} grid shapes (the CUTLASS-family bar's bar)", grid, "4", ours)
        else:
            out += section(f"{name}: {n_shapes} shapes (the grid-library bar's bars)", bs, "5", ours)
        out += extremes(bs)
    if args.plot:
        plot(bounds(read_rows([args.headroom[0]])), ours, args.plot)
    text = "\n".join(out)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
