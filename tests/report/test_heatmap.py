"""CPU tier for the report's heatmaps, checked on the matplotlib figure objects (drawn with Agg): cell values never
overlap one another and stay inside their cells, axis tick labels never overlap, and the colour bar's tick labels
all differ (no "1, 1, 1" on a narrow range)."""

import itertools
import math
import random

import pytest

from gemmrl.report import heatmap as H

pytest.importorskip("matplotlib")


def _vals(ms, ns, ks, lo=0.97, hi=1.03, seed=0):
    rnd = random.Random(seed)
    return {f"{m}_{n}_{k}": rnd.uniform(lo, hi) for m in ms for n in ns for k in ks}


def _drawn(vals):
    fig = H.heatmap_figure(vals, "t")
    fig.canvas.draw()
    return fig, fig.canvas.get_renderer()


def _panels(fig):
    return [ax for ax in fig.axes if ax.axison and not hasattr(ax, "_colorbar")]


def _colorbar_labels(fig):
    (cax,) = [ax for ax in fig.axes if hasattr(ax, "_colorbar")]
    major = [t.get_text() for t in cax.get_yticklabels() if t.get_visible() and t.get_text()]
    minor = [t.get_text() for t in cax.yaxis.get_minorticklabels() if t.get_visible() and t.get_text()]
    return major, minor


def _overlaps(boxes):
    return [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]


def _check_layout(fig, rnd):
    for ax in _panels(fig):
        boxes = [t.get_window_extent(rnd) for t in ax.texts]
        if len(boxes) <= 200:  # beyond, being inside its own cell (below) rules out overlapping another
            assert not _overlaps(boxes)
        if ax.texts:  # each value inside its own cell
            nx, ny = len(ax.images[0].get_array()[0]), len(ax.images[0].get_array())
            bb = ax.get_window_extent(rnd)
            cw, ch = bb.width / nx, bb.height / ny
            for t, box in zip(ax.texts, boxes):
                b, a = t.get_position()
                x0, y0 = bb.x0 + b * cw, bb.y0 + a * ch
                assert x0 - 0.5 <= box.x0 and box.x1 <= x0 + cw + 0.5
                assert y0 - 0.5 <= box.y0 and box.y1 <= y0 + ch + 0.5
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            assert not _overlaps([t.get_window_extent(rnd) for t in labels if t.get_visible() and t.get_text()])


def test_small_grid_writes_every_value_without_overlap():
    vals = _vals([64, 128, 256], [64, 128, 256], [64, 4096])
    fig, rnd = _drawn(vals)
    assert sum(len(ax.texts) for ax in _panels(fig)) == len(vals)
    assert sorted(t.get_text() for ax in _panels(fig) for t in ax.texts) == sorted(f"{v:.2f}" for v in vals.values())
    _check_layout(fig, rnd)


@pytest.mark.parametrize("ms,ns,ks,labelled", [
    ([2 ** i for i in range(10)], [2 ** i for i in range(10)], [64, 128, 256, 512, 1024, 2048], True),
    (range(1, 33), range(1, 33), range(1, 3), True),   # a smaller font
    ([1, 2], range(1, 100), [1], False),               # cells too narrow for a legible value: none written
])
def test_dense_grids_never_overlap(ms, ns, ks, labelled):
    fig, rnd = _drawn(_vals(ms, ns, ks))
    _check_layout(fig, rnd)
    assert all(bool(ax.texts) == labelled for ax in _panels(fig))
    w, h = fig.get_size_inches()
    assert w <= H.MAX_FIG_W + 1.2 + 1e-9
    for ax in _panels(fig):
        for t in ax.texts:
            assert H.LABEL_FONT[0] <= t.get_fontsize() <= H.LABEL_FONT[1]


@pytest.mark.parametrize("lo,hi", [(0.999, 1.001), (0.98, 1.0), (0.9, 1.2), (0.2, 5.0), (1.0, 1.0)])
def test_colorbar_tick_labels_differ(lo, hi):
    fig, _ = _drawn(_vals([64, 128], [64, 128], [64], lo=lo, hi=hi))
    major, minor = _colorbar_labels(fig)
    assert len(major) == H.CBAR_TICKS and len(set(major)) == len(major)
    assert not minor
    assert "1.00" in major  # the centre of the scale reads as itself


def test_colorbar_ticks_inside_the_range_and_read_as_their_values():
    for r in (0.05, 0.1, 0.7, 2.0):
        vmin, vmax = math.exp(-r), math.exp(r)
        ticks, labels = H.colorbar_ticks(vmin, vmax)
        assert len(set(labels)) == len(labels) == H.CBAR_TICKS
        assert all(vmin <= t <= vmax for t in ticks)
        assert [float(s) for s in labels] == ticks


def test_cell_font_bounds():
    assert H.cell_font(100, 100) == H.LABEL_FONT[1]
    assert H.cell_font(1, 100) is None and H.cell_font(100, 1) is None
