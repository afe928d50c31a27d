"""The Triton-family bar per shape, two re-measured selections side by side: speedup over vendor_best before (x) and after (y),
one panel per protocol, log axes, the diagonal drawn (above it: the later run is faster against the vendor).

    python benchmarks/acceptance/selection_compare_plot.py BEFORE.csv[.gz] AFTER.csv[.gz] --out PLOT.png [--labels "gemv,twopass"]

Only shapes re-measured in both runs are drawn; each run is its own re-measure (`gemmrl bench --triton-from`), so
ratios are compared, not times. Prints the geomean of both over the shared shapes per protocol."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from selection_table import per_shape  # noqa: E402

from gemmrl.report.plots import _plain, _plt, _save  # noqa: E402
from gemmrl.results import read_rows  # noqa: E402


def speedups(path: str) -> dict[tuple[str, str], float]:
    rows, _ = per_shape(read_rows([path]))
    return {(r["protocol"], r["mnk"]): r["speedup"] for r in rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out", required=True)
    ap.add_argument("--labels", default="before,after")
    a = ap.parse_args(argv)
    lb, la = (a.labels.split(",") + ["after"])[:2]
    b, c = speedups(a.before), speedups(a.after)
    protos = [p for p in ("graph", "cold") if any(k[0] == p and k in c for k in b)]
    if not protos:
        ap.error("the two runs share no (protocol, shape): give two re-measures of the same shapes")
    plt = _plt()
    fig, axes = plt.subplots(1, len(protos), figsize=(5.2 * len(protos), 5), squeeze=False)
    for ax, p in zip(axes[0], protos):
        keys = sorted(k for k in b if k[0] == p and k in c)
        x, y = [b[k] for k in keys], [c[k] for k in keys]
        gx, gy = (math.exp(sum(map(math.log, v)) / len(v)) for v in (x, y))
        print(f"{p}: {len(keys)} shapes, geomean {lb} {gx:.3f}, {la} {gy:.3f}")
        lo, hi = min(x + y) * 0.95, max(x + y) * 1.05
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
        ax.axhline(1.0, color="grey", lw=0.5, ls=":")
        ax.axvline(1.0, color="grey", lw=0.5, ls=":")
        ax.scatter(x, y, s=14)
        for k, xi, yi in zip(keys, x, y):
            if abs(math.log(yi / xi)) > math.log(1.15):
                ax.annotate(k[1], (xi, yi), fontsize=6, xytext=(3, 2), textcoords="offset points")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"{lb}: speedup over vendor_best",
               ylabel=f"{la}: speedup over vendor_best",
               title=f"{p}: geomean {gx:.3f} -> {gy:.3f} ({len(keys)} shapes)")
        ticks = [t / 10 for t in range(1, 40) if lo <= t / 10 <= hi]
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        for axis in (ax.xaxis, ax.yaxis):
            _plain(axis)
            axis.set_minor_formatter("")
    _save(fig, Path(a.out))
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
