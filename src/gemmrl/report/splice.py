"""A figure over the grid built from several runs, rebuilt from its committed recipe.

A 1000-shape figure is one measure pass with the cells later passes re-measured: each later file replaces every row
of the cells it measured, (protocol, dtype, acc, shape), never a mix of two runs in one cell. The markdown that states
the figure (``benchmarks/acceptance/library_measure.py --md``) is its recipe: its first line names the files in
order, ``Sources: first, second, later (supersedes n cells), ...``, each beside the markdown. ``gemmrl report
--splice MD`` reads them again, supersedes in order and recomputes the figures (per protocol, dtype and shape class:
gemmrl.mm / vendor_best geomean, minimum, shapes below 0.98 before and after the noise rule, how many a generated
kernel served; CUDA-L2's offline statistic), which ``--check`` compares with the markdown's own lines.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..library import served_desc
from ..measure.bench import noise_rule_below
from ..problem import grid
from ..results import read_rows
from ..summary import ratios, table

CLASSES = ("small", "other", "large", "all")
LABEL = {"small": "min(M,N) <= 256", "other": "the rest", "large": "all dims >= 4096", "all": "all"}
BARS = {"graph": 1.05, "cold": 1.10}
FLOOR = 0.98  # no shape below this (noise rule)
OFFLINE_BAR = 1.07
REFERENCE = {"offline": "cublaslt_autotuned", "server": "cublaslt_autotuned"}  # CUDA-L2's; else vendor_best
SELECTION_COLUMN = 6  # the markdown table's 'selection run, same shapes' cell: given only with the library measured


class SpliceError(ValueError):
    """A splice's recipe that cannot be read (the caller's input, with what to give instead)."""


def shape_class(mnk: str) -> str:
    m, n, k = (int(x) for x in mnk.split("_"))
    if min(m, n) <= 256:
        return "small"
    if min(m, n, k) >= 4096:
        return "large"
    return "other"


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def cell(r: dict) -> tuple[str, str, str, str]:
    return r["protocol"], r["dtype"], r["acc"], r["mnk"]


def supersede(rows: list[dict], later: list[dict]) -> tuple[list[dict], int]:
    """``rows`` with every cell (protocol, dtype, acc, shape) that ``later`` has rows of replaced by those rows
    (first runs and rechecks alike), and how many cells were replaced; later cells the earlier rows lack are added."""
    cells = {cell(r) for r in later}
    kept = [r for r in rows if cell(r) not in cells]
    return kept + later, len(cells & {cell(r) for r in rows})


def splice_sources(md) -> tuple[list[Path], list[Path]]:
    """The files of a splice, from its markdown's first line ``Sources: a, b (supersedes n cells), ...``, resolved
    beside the markdown: (the earlier passes, measure and offline; the superseding ones, in order)."""
    md = Path(md)
    if not md.is_file():
        raise SpliceError(f"{md}: no such file; give the markdown benchmarks/acceptance/library_measure.py --md wrote")
    first = (md.read_text().splitlines() or [""])[0]
    if not first.startswith("Sources: "):
        raise SpliceError(f"{md}: no 'Sources: ...' first line; give the markdown "
                          "benchmarks/acceptance/library_measure.py --md wrote")
    base, later = [], []
    for entry in first[len("Sources: "):].split(", "):
        name, sep, _ = entry.strip().partition(" (supersedes ")
        (later if sep else base).append(md.parent / Path(name).name)
    missing = [str(p) for p in base + later if not p.exists()]
    if missing:
        raise SpliceError(f"{md}: its sources are not beside it: {', '.join(missing)}")
    return base, later


def splice_rows(md) -> list[dict]:
    """Every row of a splice (measure and offline), each superseded cell replaced in order."""
    return splice_rows_of(*splice_sources(md))


def splice_rows_of(base, later) -> list[dict]:
    """The rows of the ``base`` files, then each of the ``later`` files superseding the cells it measured, in order."""
    rows = read_rows([str(p) for p in base])
    for path in later:
        rows, _ = supersede(rows, read_rows([str(path)]))
    return rows


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


def offline_statistic(rows: list[dict]) -> dict | None:
    """CUDA-L2's offline statistic over the shapes where both gemmrl and cublaslt_autotuned ran."""
    rat = {k: v for k, v in ratios(rows, "gemmrl", "cublaslt_autotuned").items() if k[0] == "offline"}
    if not rat:
        return None
    xs = list(rat.values())
    return {"shapes": len(xs), "mean": statistics.fmean(xs), "geomean": geomean(xs), "min": min(xs)}


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


def rebuild(md) -> str:
    """The splice's markdown made again from the files its first line names (the figures only: no selection
    column, no comparison with an earlier pass)."""
    base, later = splice_sources(md)
    rows = splice_rows_of(base, later)
    measure = [r for r in rows if r["protocol"] not in REFERENCE]
    offline = [r for r in rows if r["protocol"] in REFERENCE]
    sources = [p.name for p in base] + [f"{p.name} (supersedes n cells)" for p in later]
    return markdown(measure_table(measure), offline_statistic(offline), coverage(rows), sources)


def figures(text: str) -> list[str]:
    """The lines of a splice's markdown that state figures: the table's rows (the selection column blanked: it needs
    the library measured), the shapes below after the noise rule, the offline statistic."""
    out = []
    for line in text.split("\n\n", 1)[-1].splitlines():
        if line.startswith("Against the earlier pass"):
            break
        if line.startswith("| ") and not line.startswith(("| protocol ", "|---")):
            cells = line.split(" | ")
            if len(cells) > SELECTION_COLUMN:
                cells[SELECTION_COLUMN] = ""
            out.append(" | ".join(cells))
        elif line.startswith(("Below 0.98 after the noise rule", "offline, CUDA-L2's statistic", "Coverage of")):
            out.append(line)
    return out


def check(md) -> list[tuple[str, str]]:
    """(as committed, as rebuilt) for each figure line of ``md`` that its sources no longer give; [] when it
    rebuilds exactly."""
    splice_sources(md)  # the recipe first: a missing file or source is the error to give
    have = figures(Path(md).read_text())
    if not have:
        raise SpliceError(f"{md}: no figure lines (a table row, the offline statistic) to check")
    again = figures(rebuild(md))
    if len(have) != len(again):
        return [("\n".join(have), "\n".join(again))]
    return [(a, b) for a, b in zip(have, again) if a != b]
