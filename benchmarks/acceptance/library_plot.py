"""What a library serves per shape, as measured in the run that selected it: one panel per protocol, per shape the
served entry's speedup over vendor_best (both from the selection rows) against FLOPs, coloured by family.

    python benchmarks/acceptance/library_plot.py LIBRARY.json[.gz] --out PLOT.png [--gpu "NVIDIA H100 80GB HBM3"]

Per (shape, protocol) the fastest exact entry over the layouts (what `gemmrl.mm` serves at that shape for that
protocol; an M-range bucket serves shapes between the measured ones and is left out); a vendor entry is 1.0 by
construction. The legend gives each family's count and the geomean over all shapes. These are
selection figures, an upper bound for a separate re-measure (DESIGN.md's noise rule), not the figures that count.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.library import Library, LibraryError  # noqa: E402
from gemmrl.problem import GemmProblem  # noqa: E402
from gemmrl.report.plots import _plain, _plt, _save  # noqa: E402
from gemmrl.search.loop import shape_key  # noqa: E402

COLOURS = {"vendor": "#9e9e9e", "triton": "#1f77b4", "cutlass": "#ff7f0e", "tiny": "#2ca02c"}


def served(lib: Library, gpu: str | None, dtype: str | None = None) -> dict[str, dict[str, tuple[float, float, str]]]:
    """protocol -> shape key -> (flops, vendor_best_ms / served time_ms, family): the fastest entry per problem
    (only ``dtype``'s entries when given). Keyed as the tuning loop names a problem (``loop.shape_key``): an fp16
    and a bf16 entry of one shape are two problems, never compared with each other."""
    best: dict[tuple[str, str], object] = {}
    for e in lib.entries:
        if (gpu and e.gpu != gpu) or e.m_lo != e.m_hi:  # exact entries: what a bucket serves between its shapes
            continue                                     # was not measured there
        if dtype and e.dtype != dtype:
            continue
        k = (e.protocol, shape_key(GemmProblem(e.M, e.N, e.K, dtype=e.dtype, acc=e.acc)))
        if k not in best or e.time_ms < best[k].time_ms:
            best[k] = e
    out: dict[str, dict] = {}
    for (p, key), e in best.items():
        out.setdefault(p, {})[key] = (2.0 * e.M * e.N * e.K, e.vendor_best_ms / e.time_ms, e.family)
    return out


PANEL_ORDER = ("graph", "cold", "offline", "server")


def plot(data: dict, path: Path, title: str, *, ylabel: str = "vendor_best time / served time",
         served_word: str = "", ringed: dict | None = None, ring_label: str = "", floor: float | None = None) -> Path:
    """One panel per key of ``data`` (a protocol, or "protocol dtype"), each point (flops, ratio, family) of a
    shape; ``ringed``: panel -> the shape keys to ring in red (``ring_label`` in the legend), ``floor``: a dotted
    line there."""
    plt = _plt()
    panels = sorted(data, key=lambda p: (PANEL_ORDER.index(p.split()[0]) if p.split()[0] in PANEL_ORDER else 9, p))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.6), squeeze=False)
    for ax, p in zip(axes[0], panels):
        rows = data[p]
        geo = math.exp(sum(math.log(r) for _, r, _ in rows.values()) / len(rows))
        for fam, col in COLOURS.items():
            pts = [(f, r) for f, r, fm in rows.values() if fm == fam]
            if pts:
                ax.scatter([f for f, _ in pts], [r for _, r in pts], s=9, c=col, alpha=0.75,
                           label=f"{fam}{served_word} ({len(pts)})", edgecolors="none")
        lost = [rows[k] for k in sorted((ringed or {}).get(p, ())) if k in rows]
        if lost:
            ax.scatter([f for f, *_ in lost], [r for _, r, _ in lost], s=40, facecolors="none", edgecolors="r",
                       lw=0.8, label=f"{ring_label} ({len(lost)})")
        ax.axhline(1.0, color="k", lw=0.6)
        if floor is not None:
            ax.axhline(floor, color="r", lw=0.5, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain(ax.yaxis)
        lo, hi = ax.get_ylim()
        if hi / lo < 10:  # within a decade a log axis labels one or two ticks: label evenly spaced ones instead
            from matplotlib.ticker import MaxNLocator, NullLocator
            ax.yaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 2.5, 5, 10]))  # 1.0 on a tick
            ax.yaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("FLOPs (2MNK)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{p}: {len(rows)} shapes, geomean {geo:.4f}")
        ax.legend(loc="upper right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("library")
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", help="only this GPU's entries (default all)")
    ap.add_argument("--dtype", help="only this input dtype's entries, e.g. fp16 or bf16 (default all, each apart)")
    args = ap.parse_args(argv)
    try:
        lib = Library.load(args.library)
    except LibraryError as e:
        print(f"library_plot: {e}", file=sys.stderr)
        return 2
    data = served(lib, args.gpu, args.dtype)
    if not data:
        what = " ".join(x for x in (args.gpu, args.dtype) if x)
        print(f"library_plot: no entries{' for ' + what if what else ''} in {args.library}", file=sys.stderr)
        return 2
    path = plot(data, Path(args.out), f"{Path(args.library).name}{' ' + args.dtype if args.dtype else ''}: "
                                      "selection-run figures")
    for p, rows in data.items():
        geo = math.exp(sum(math.log(r) for _, r, _ in rows.values()) / len(rows))
        print(f"{p}: {len(rows)} shapes, geomean {geo:.4f}, generated served on {sum(f != 'vendor' for *_, f in rows.values())}")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
