"""Heatmaps of per-shape speedups for `gemmrl report`: one panel per K over (M, N), log colour scale centred on 1.

Legible at any grid size: each panel is sized by its grid (up to a cap), a cell's value is written at the largest
font that fits the cell and left out where that font would be too small to read, axis ticks are thinned to what
their font leaves room for, and the colour bar has a few ticks with as many decimals as it takes for no two to read
alike. matplotlib is an optional dependency, imported through ``plots._plt`` inside the functions only.
"""

from __future__ import annotations

import math
from pathlib import Path

from .plots import DPI, _mnk, _plt

MAX_COLS = 5                  # panels per row
MAX_FIG_W = 20.0              # inches
PANEL_MIN, PANEL_MAX = (2.6, 2.4), (8.0, 8.0)  # (width, height) of one panel, inches
CELL_IN = (0.36, 0.26)        # (width, height) a cell asks for, inches, until the panel's cap
LABEL_FONT = (4.5, 7.0)       # smallest legible and largest cell-value font, points
TICK_FONT = 6.0
LABEL_EM = 2.6                # width of a value such as "0.98" in ems, with a margin
CBAR_TICKS = 5


def colorbar_ticks(vmin: float, vmax: float, n: int = CBAR_TICKS) -> tuple[list[float], list[str]]:
    """``n`` ticks evenly spaced on the log scale from ``vmin`` to ``vmax``, each rounded (inwards at the ends) to
    the fewest decimals, 2 or more, at which every label differs; the ticks are the labels' values."""
    lo, hi = math.log(vmin), math.log(vmax)
    raw = [math.exp(lo + i * (hi - lo) / (n - 1)) for i in range(n)]
    for d in range(2, 8):
        q = 10 ** d
        ticks = [min(max(round(v, d), math.ceil(vmin * q) / q), math.floor(vmax * q) / q) for v in raw]
        labels = [f"{t:.{d}f}" for t in ticks]
        if len(set(labels)) == n:
            return ticks, labels
    return raw, [f"{v:.3g}" for v in raw]


def _panel_size(nx: int, ny: int) -> tuple[float, float]:
    w = min(max(CELL_IN[0] * nx + 1.0, PANEL_MIN[0]), PANEL_MAX[0])
    h = min(max(CELL_IN[1] * ny + 0.9, PANEL_MIN[1]), PANEL_MAX[1])
    return w, h


def _cell_points(fig, ax, nx: int, ny: int) -> tuple[float, float]:
    """(width, height) of one cell of ``ax`` in points, as laid out now."""
    bb = ax.get_window_extent()
    return bb.width / nx * 72 / fig.dpi, bb.height / ny * 72 / fig.dpi


def cell_font(cell_w: float, cell_h: float) -> float | None:
    """The font (points) a cell's value is written in: the largest up to LABEL_FONT[1] that fits the cell, None
    where that is below LABEL_FONT[0] (the cell stays unlabelled; its colour and the colour bar still say)."""
    fs = min(LABEL_FONT[1], cell_w / LABEL_EM, cell_h / 1.5)
    return fs if fs >= LABEL_FONT[0] else None


def _ticks(axis_set, labels: list[str], cell: float, along: float, **kw) -> None:
    """Every ``step``-th tick label, ``step`` as small as keeps labels ``along`` points apart at ``cell`` points
    per cell."""
    step = max(1, math.ceil(along / cell))
    idx = list(range(0, len(labels), step))
    axis_set(idx, [labels[i] for i in idx], fontsize=TICK_FONT, **kw)


def heatmap_figure(vals: dict[str, float], title: str):
    """The figure (not saved) for ``vals`` = {mnk: ratio}; None where there is nothing to draw."""
    if not vals:
        return None
    from matplotlib.colors import LogNorm  # optional dependency: only the plots need it

    plt = _plt()
    pts = {_mnk(k): v for k, v in vals.items()}
    Ms, Ns, Ks = (sorted({t[i] for t in pts}) for i in range(3))
    r = max(max(abs(math.log(v)) for v in pts.values()), 0.05)
    norm = LogNorm(vmin=math.exp(-r), vmax=math.exp(r))
    pw, ph = _panel_size(len(Ns), len(Ms))
    cols = max(1, min(MAX_COLS, len(Ks), int(MAX_FIG_W // pw)))
    rows = math.ceil(len(Ks) / cols)
    fig, axs = plt.subplots(rows, cols, figsize=(pw * cols + 1.2, ph * rows + 0.8), squeeze=False, dpi=DPI)
    used = []
    im = None
    for i, ax in enumerate(axs.flat):
        if i >= len(Ks):
            ax.axis("off")
            continue
        grid = [[pts.get((m, n, Ks[i]), math.nan) for n in Ns] for m in Ms]
        im = ax.imshow(grid, norm=norm, cmap="RdBu", origin="lower", aspect="auto")
        ax.set_xticks(range(len(Ns)), [str(n) for n in Ns], rotation=90, fontsize=TICK_FONT)
        ax.set_yticks(range(len(Ms)), [str(m) for m in Ms], fontsize=TICK_FONT)
        ax.set_title(f"K={Ks[i]}", fontsize=9)
        used.append((ax, Ks[i]))
    fig.supxlabel("N", fontsize=9)
    fig.supylabel("M", fontsize=9)
    fig.suptitle(title + " (blue > 1 faster, red < 1)", fontsize=10)
    fig.tight_layout()
    cb = fig.colorbar(im, ax=axs.ravel().tolist(), shrink=0.8)
    cb.ax.minorticks_off()
    ticks, labels = colorbar_ticks(norm.vmin, norm.vmax)
    cb.set_ticks(ticks, labels=labels)
    cb.ax.tick_params(labelsize=7)
    # cells are sized now (the colour bar took its share): thin the ticks, write the values that fit
    for ax, k in used:
        cw, ch = _cell_points(fig, ax, len(Ns), len(Ms))
        _ticks(ax.set_xticks, [str(n) for n in Ns], cw, 1.4 * TICK_FONT, rotation=90)
        _ticks(ax.set_yticks, [str(m) for m in Ms], ch, 1.4 * TICK_FONT)
        fs = cell_font(cw, ch)
        if fs is None:
            continue
        for a, m in enumerate(Ms):
            for b, n in enumerate(Ns):
                v = pts.get((m, n, k))
                if v is not None:
                    dark = abs(math.log(v)) > 0.6 * r  # the colour map's deep ends: white text reads there
                    ax.text(b, a, f"{v:.2f}", ha="center", va="center", fontsize=fs, color="w" if dark else "k")
    return fig


def heatmaps(vals: dict[str, float], path: Path, title: str) -> Path | None:
    """Write :func:`heatmap_figure` as a PNG at ``path``."""
    fig = heatmap_figure(vals, title)
    if fig is None:
        return None
    fig.savefig(path, dpi=DPI)
    _plt().close(fig)
    return path
