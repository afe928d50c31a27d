"""Plots (matplotlib, Agg, PNG at dpi 100) and a small markdown-to-HTML step for `gemmrl report`.
matplotlib is an optional dependency, imported inside the functions only."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

from .data import ratios

DPI = 100


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "x"


def _plt():
    import matplotlib  # optional dependency: only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # optional dependency: only the plots need it

    return plt


def _mnk(name: str) -> tuple[int, int, int]:
    m, n, k = (int(x) for x in name.split(" ")[0].split("_"))
    return m, n, k


def _plain(axis) -> None:
    """Plain numbers (0.9, 1.2) on a log-scaled ratio axis instead of 9x10^-1."""
    from matplotlib.ticker import FuncFormatter  # optional dependency: only the plots need it

    f = FuncFormatter(lambda v, _: f"{v:.3g}")
    axis.set_major_formatter(f)
    axis.set_minor_formatter(f)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    _plt().close(fig)
    return path


def distribution(tab, prs, protos, path: Path, label: str) -> Path | None:
    """Box plot of per-shape speedups, one box per baseline, one panel per protocol (log scale)."""
    data = [(p, [(f"{n}/{d}" if label == "vendor paths" else d, list(ratios(tab, p, n, d).values())) for n, d in prs])
            for p in protos]
    data = [(p, [(l, xs) for l, xs in ds if xs]) for p, ds in data]
    data = [(p, ds) for p, ds in data if ds]
    if not data:
        return None
    plt = _plt()
    fig, axs = plt.subplots(1, len(data), figsize=(4 * len(data) + 1, 4), squeeze=False)
    for ax, (p, ds) in zip(axs[0], data):
        ax.boxplot([xs for _, xs in ds], showmeans=True)
        ax.set_xticks(range(1, len(ds) + 1), [l for l, _ in ds], rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        _plain(ax.yaxis)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(f"{p}", fontsize=10)
        ax.set_ylabel("speedup (per shape)")
    fig.suptitle(f"speedup distribution: {label}", fontsize=11)
    return _save(fig, path)


def vs_flops(tab, prs, protos, path: Path, label: str) -> Path | None:
    """Per-shape speedup against FLOPs (2MNK, log x), one panel per protocol, one series per pair."""
    data = []
    for p in protos:
        ser = []
        for n, d in prs:
            rs = ratios(tab, p, n, d)
            if rs:
                xs = [2 * math.prod(_mnk(k)) for k in rs]
                ser.append((f"{n}/{d}" if label == "vendor paths" else f"vs {d}", xs, list(rs.values())))
        if ser:
            data.append((p, ser))
    if not data:
        return None
    return _flops_panels(data, "speedup", f"speedup against FLOPs: {label}", path, ratio=True)


def floor_fraction(tab, names, protos, path: Path) -> Path | None:
    """floor_ms / time_ms per shape (1 = at the roofline floor) against FLOPs."""
    data = []
    for p in protos:
        ser = []
        for c in names:
            pts = []
            for key, by in tab.items():
                r = by.get(c)
                if key[0] == p and r is not None:
                    try:
                        fr = float(r.get("floor_ms") or "nan") / float(r["time_ms"])
                    except (ValueError, ZeroDivisionError):
                        continue
                    if math.isfinite(fr):
                        pts.append((2 * math.prod(_mnk(key[3])), fr))
            if pts:
                ser.append((c, [x for x, _ in pts], [y for _, y in pts]))
        if ser:
            data.append((p, ser))
    if not data:
        return None
    return _flops_panels(data, "floor_ms / time_ms", "fraction of the roofline floor per shape", path, ratio=False)


def _flops_panels(data, ylabel: str, title: str, path: Path, ratio: bool) -> Path:
    """One scatter panel per protocol of ``data`` = [(protocol, [(label, flops, ys)])], FLOPs on a log axis;
    ``ratio``: log y with a line at 1.0 (speedups), else y in [0, 1.05] (fractions)."""
    plt = _plt()
    fig, axs = plt.subplots(1, len(data), figsize=(4 * len(data) + 1, 3.8), squeeze=False)
    for ax, (p, ser) in zip(axs[0], data):
        for lab, xs, ys in ser:
            ax.scatter(xs, ys, s=10, label=lab, alpha=0.7)
        ax.set_xscale("log")
        if ratio:
            ax.set_yscale("log")
            _plain(ax.yaxis)
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
        else:
            ax.set_ylim(0, 1.05)
        ax.set_xlabel("FLOPs (2MNK)")
        ax.set_ylabel(ylabel)
        ax.set_title(p, fontsize=10)
    axs[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    return _save(fig, path)


def claims_scatter(joined, path: Path, claim_label: str, of: str) -> Path | None:
    if not joined:
        return None
    plt = _plt()
    protos = sorted({j["protocol"] for j in joined})
    fig, axs = plt.subplots(1, len(protos), figsize=(4.2 * len(protos) + 1, 4), squeeze=False)
    for ax, p in zip(axs[0], protos):
        for b in sorted({j["baseline"] for j in joined}):
            js = [j for j in joined if j["protocol"] == p and j["baseline"] == b]
            ax.scatter([j["claim"] for j in js], [j["measured"] for j in js], s=10, label=f"vs {b}", alpha=0.7)
        lo = min(min(j["claim"], j["measured"]) for j in joined) * 0.9
        hi = max(max(j["claim"], j["measured"]) for j in joined) * 1.1
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain(ax.xaxis)
        _plain(ax.yaxis)
        ax.set_xlabel(claim_label, fontsize=8)
        ax.set_ylabel(f"measured here: {of} / baseline", fontsize=8)
        ax.set_title(p, fontsize=10)
    axs[0][0].legend(fontsize=7)
    return _save(fig, path)


def _inline(s: str) -> str:
    s = html.escape(s)
    s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", s)
    s = re.sub(r"_(.+?)_(?=\s|$|[.,;:)])", r"<i>\1</i>", s) if s.startswith("_") else s
    return re.sub(r"`(.+?)`", r"<code>\1</code>", s)


def md_to_html(text: str) -> str:
    """Enough markdown for the report: headings, pipe tables, bullet lists, paragraphs."""
    out: list[str] = []
    lines = text.strip("\n").split("\n")
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("#"):
            lvl = len(ln) - len(ln.lstrip("#"))
            out.append(f"<h{lvl}>{_inline(ln[lvl:].strip())}</h{lvl}>")
        elif ln.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            out.append("<table><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in rows[0]) + "</tr>")
            for r in rows[2:]:
                out.append("<tr>" + "".join(f"<td{' class=num' if j else ''}>{_inline(c)}</td>"
                                            for j, c in enumerate(r)) + "</tr>")
            out.append("</table>")
            continue
        elif ln.startswith("- "):
            out.append("<ul>")
            while i < len(lines) and lines[i].startswith("- "):
                out.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("</ul>")
            continue
        elif ln.strip():
            out.append(f"<p>{_inline(ln)}</p>")
        i += 1
    return "\n".join(out)
