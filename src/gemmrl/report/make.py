"""`gemmrl report`: tables, plots, a markdown summary and one self-contained HTML page, made from
result rows only (DESIGN.md "Results files", "Speedup"). Never a hand-entered number.

"ours" is the candidate reported (``candidate``, default every non-baseline candidate present). With
vendor-only files the report says so and shows each vendor path against ``vendor_best`` instead.
CUDA-L2's published per-shape ratios (``claims``) are shown beside ours, labelled as claims from
another harness and machine. Files from different GPUs, dates or commits are compared on the
(shape, protocol, candidate) they share.
"""

from __future__ import annotations

import base64
import csv
import html
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from ..results import ResultsError, open_text, read_rows
from ..summary import AGGREGATES, BASELINES, REFERENCE_COLUMNS, Stats, speed
from . import heatmap as hm
from . import plots as rp
from . import verdict as vd
from .data import PROTO_ORDER, protocols, ratios, shape_table
from .plots import md_to_html

CUDA_L2_COLS = ("torch", "cublas", "cublaslt_heuristic", "cublaslt_autotuned")
# CUDA-L2's column names -> ours (its "-max" = the faster layout = our aggregate).
CLAIM_NAMES = {"torch.matmul": "torch", "cuBLAS-max": "cublas", "cuBLASLt-heuristic-max": "cublaslt_heuristic",
               "cuBLASLt-auto-tuning-max": "cublaslt_autotuned"}
CLAIM_LABEL = "claim (CUDA-L2's harness and machine)"
VENDOR_PATHS = BASELINES + tuple(k for k in AGGREGATES if k != "vendor_best")


class ReportError(ResultsError):
    pass


@dataclass
class Report:
    out: Path
    markdown: Path
    html: Path
    images: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)          # per group: its title and headline tables (md)
    headline_images: list[tuple[Path, str]] = field(default_factory=list)  # per group: distribution, vs FLOPs
    verdict: list[str] = field(default_factory=list)           # per group and protocol: ours / vendor_best


# ----------------------------------------------------------------------------------------- input

def _check_numeric(path: Path) -> None:
    """Rows marked verified=true must carry time_ms and tflops that parse as numbers (empty only
    where a reason says why the row was not timed)."""
    with open_text(path) as fh:
        rd = csv.DictReader(fh)
        for r in rd:
            if r.get("verified") != "true":
                continue
            for col in ("time_ms", "tflops"):
                v = r.get(col) or ""
                if v == "" and r.get("reason"):
                    continue
                try:
                    float(v)
                except ValueError:
                    raise ReportError(f"{path}:{rd.line_num}: verified row has non-numeric {col}={v!r} "
                                      f"(candidate {r.get('candidate')!r}, mnk {r.get('mnk')!r})") from None


def load(paths: Sequence[str | Path]) -> dict[Path, list[dict[str, str]]]:
    """{file: rows}; every file is checked (columns, field count, numbers) before anything is used."""
    out = {}
    for p in map(Path, paths):
        rows = read_rows([p])
        _check_numeric(p)
        out[p] = rows
    return out


def identity(rows: Sequence[Mapping[str, str]]) -> tuple[str, str, str]:
    """(gpu, date, git_sha) of a file's rows: what makes two files worth comparing."""
    def one(col, f=lambda v: v):
        vals = sorted({f(r.get(col, "")) for r in rows if r.get(col)})
        return "+".join(vals) if vals else "?"
    return one("gpu"), one("timestamp", lambda v: v[:10]), one("git_sha")


# ---------------------------------------------------------------------------------------- numbers

def choose(tab, candidate: str | None) -> tuple[list[str], bool]:
    """(names reported as ours, fallback?) -- fallback: vendor-only rows, paths vs vendor_best."""
    present = {c for by in tab.values() for c in by}
    if candidate:
        if candidate not in present:
            raise ReportError(f"--candidate {candidate!r}: no usable row has it (present: {sorted(present)})")
        return [candidate], False
    ours = sorted(c for c in present if c not in BASELINES and c not in AGGREGATES)
    return (ours, False) if ours else ([p for p in CUDA_L2_COLS if p in present], True)


def pairs(names: list[str], fallback: bool, bases=REFERENCE_COLUMNS) -> list[tuple[str, str]]:
    """(numerator, denominator) pairs one section reports."""
    if fallback:
        return [(p, "vendor_best") for p in names]
    return [(c, b) for c in names for b in bases if b != c]


def stats_records(tab, prs) -> list[dict]:
    out = []
    for p in protocols(tab):
        for num, den in prs:
            xs = list(ratios(tab, p, num, den).values())
            if xs:
                out.append({"protocol": p, "num": num, "den": den, **Stats.of(xs).__dict__})
    return out


# ----------------------------------------------------------------------------------------- tables

def _pct(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def headline(tab, num_or_paths, fallback: bool, stat: str, cols: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """CUDA-L2's table: rows protocols, columns baselines, cells mean(per-shape ratio) - 1 (stat
    'amean' as CUDA-L2 reports, or 'geomean'), shape counts in brackets. In fallback, columns are the
    vendor paths and every cell is path / vendor_best."""
    hdr = ["protocol"] + [f"{c} (vs vendor_best)" if fallback else c for c in cols]
    body = []
    for p in protocols(tab):
        cells = []
        for c in cols:
            num, den = (c, "vendor_best") if fallback else (num_or_paths, c)
            xs = list(ratios(tab, p, num, den).values())
            s = Stats.of(xs)
            cells.append(f"{_pct(getattr(s, stat) - 1)} ({s.n})" if s.n else "–")
        body.append([p] + cells)
    return hdr, body


def stats_table(recs) -> tuple[list[str], list[list[str]]]:
    hdr = ["protocol", "speed of", "over", "shapes", "geomean", "arith. mean", "median", "min", "share < 1.0"]
    return hdr, [[r["protocol"], r["num"], r["den"], str(r["n"]), f"{r['geomean']:.3f}", f"{r['amean']:.3f}",
                  f"{r['median']:.3f}", f"{r['min']:.3f}", f"{r['share_below']:.2f}"] for r in recs]


# ----------------------------------------------------------------------------------------- claims

def read_claims(path: str | Path) -> dict[str, dict[tuple[str, str], float]]:
    """{mnk: {(protocol, our baseline name): claimed ratio}} from CUDA-L2's published table."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    with open(path, newline="") as fh:
        rd = csv.DictReader(fh)
        if "mnk" not in (rd.fieldnames or []):
            raise ReportError(f"{path}: no 'mnk' column; not CUDA-L2's claims table")
        for r in rd:
            d = out.setdefault(r["mnk"], {})
            for proto in ("offline", "server"):
                for theirs, ours in CLAIM_NAMES.items():
                    v = r.get(f"{proto}_{theirs}", "")
                    try:
                        d[(proto, ours)] = float(v)
                    except ValueError:
                        if v:
                            raise ReportError(f"{path}:{rd.line_num}: {proto}_{theirs}={v!r} is not a number") from None
    return out


def claims_join(tab, claims, num: str | None) -> list[dict]:
    """Per (protocol, baseline, shape) both have: claim and our measured ratio (num over baseline;
    num None = vendor_best, what choosing the best vendor path gives)."""
    num = num or "vendor_best"
    out = []
    for p in protocols(tab):
        for b in CUDA_L2_COLS:
            for mnk, x in sorted(ratios(tab, p, num, b).items()):
                c = claims.get(mnk.split(" ")[0], {}).get((p, b))
                if c is not None:
                    out.append({"protocol": p, "baseline": b, "mnk": mnk, "claim": c, "measured": x, "of": num})
    return out


# ------------------------------------------------------------------------------------ comparisons

def compare(rows_a, rows_b) -> list[dict]:
    """Per shared (shape, protocol, candidate): speed in B / speed in A; Stats per (protocol, candidate)."""
    ta, tb = shape_table(rows_a), shape_table(rows_b)
    acc: dict[tuple[str, str], list[float]] = {}
    for k in sorted(set(ta) & set(tb)):
        for c in sorted(set(ta[k]) & set(tb[k])):
            acc.setdefault((k[0], c), []).append(speed(tb[k][c]) / speed(ta[k][c]))
    key = lambda pc: (PROTO_ORDER.index(pc[0]) if pc[0] in PROTO_ORDER else 9, pc)  # noqa: E731
    return [{"protocol": p, "candidate": c, **Stats.of(xs).__dict__} for (p, c), xs in sorted(acc.items(), key=lambda i: key(i[0]))]


# ------------------------------------------------------------------------------------------ driver

def _label(p: Path, rows) -> str:
    gpu, day, sha = identity(rows)
    return f"{p.name} ({gpu}, {day}, git {sha})"


def make_report(results: Sequence[str | Path], out: str | Path, candidate: str | None = None,
                claims: str | Path | None = None, compare_files: Sequence[str | Path] | None = None,
                plots: bool = True) -> Report:
    """Write report.md, report.html and PNGs under ``out`` from result rows; nothing is written if
    any input is malformed."""
    files = load(list(results) + [f for f in (compare_files or []) if Path(f) not in map(Path, results)])
    if not files:
        raise ReportError("no results files given")
    claim_data = read_claims(claims) if claims else None
    res_paths = [Path(p) for p in results]
    # Files of one identity are reported together; different GPUs/dates/commits get own sections.
    groups: dict[tuple, list[Path]] = {}
    for p in res_paths:
        groups.setdefault(identity(files[p]), []).append(p)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(out, out / "report.md", out / "report.html")
    md: list[str] = []
    parts: list[tuple[str, str]] = []  # (kind, payload): ('md', text) or ('img', path\tcaption)

    def emit(text: str) -> None:
        md.append(text)
        parts.append(("md", text))

    def image(path: Path | None, caption: str) -> None:
        if path is None:
            return
        rep.images.append(path)
        md.append(f"![{caption}]({path.name})\n")
        parts.append(("img", f"{path}\t{caption}"))

    emit("# gemmrl report\n")
    verdict_at = len(parts)  # the verdict lines go here, once every group has given its own
    emit("Made by `gemmrl report` from result rows only (verified, first-run rows; see "
         "summary.usable). Speedup = speed(ours) / speed(baseline); offline/server: ratio of mean per-call TFLOPS.\n")
    emit("## Inputs\n\n" + "\n".join(f"- {_label(p, files[p])}: {len(files[p])} rows" for p in files) + "\n")
    for gi, (ident, paths) in enumerate(groups.items()):
        rows = [r for p in paths for r in files[p]]
        tab = shape_table(rows)
        prefix = "" if len(groups) == 1 else f"g{gi}_"
        names, fallback = choose(tab, candidate)
        protos = protocols(tab)
        emit(f"## {', '.join(p.name for p in paths)}\n\n{ident[0]}, {ident[1]}, git {ident[2]}; "
             f"{len({k[3] for k in tab})} shapes; protocols covered: {', '.join(protos) or 'none'}.\n")
        if not tab:
            emit("_No usable (verified, timed, first-run) rows._\n")
            continue
        if fallback:
            note = ("No candidate of ours in these rows (vendor-only file): each vendor path is reported "
                    "against vendor_best (ratio <= 1; 1 = that path is the best vendor call).")
            rep.notes.append(note)
            emit(f"**{note}**\n")
            groups_ = [("vendor paths", None)]
        else:
            groups_ = [(c, c) for c in names]
        for label, num in groups_:
            prs = pairs(names if fallback else [num], fallback)
            if not fallback:
                emit(f"### {label}\n")
            rep.headline.append(f"**{', '.join(p.name for p in paths)}** ({ident[0]}, {ident[1]}, git {ident[2]}; "
                                f"{len({k[3] for k in tab})} shapes; {label})\n")
            for stat, title, cols in (("amean", "arithmetic mean of per-shape ratios − 1 (CUDA-L2's statistic)", CUDA_L2_COLS),
                                      ("geomean", "geometric mean of per-shape ratios − 1", REFERENCE_COLUMNS)):
                if fallback:
                    cols = names
                text = f"**CUDA-L2's headline table, {title}** (shapes in brackets)\n\n" + md_table(
                    *headline(tab, num, fallback, stat, cols))
                emit(text)
                rep.headline.append(text)
            emit("**All statistics**\n\n" + md_table(*stats_table(stats_records(tab, prs))))
            vnum = "torch" if fallback else num
            where = "" if len(groups) == 1 else f"{', '.join(p.name for p in paths)}, "
            rep.verdict += [where + v.line() + ("; vendor-only rows, no candidate of ours" if fallback else "")
                            for v in vd.verdicts(rows, tab, vnum)]
            vhdr, vbody = vd.shape_rows(tab, vnum)
            if vbody:
                emit(f"**Per shape: {vd.shown(vnum)} against vendor_best** (worst ratio first in each protocol; "
                     "ratio = speed of the first over the second, > 1: faster)\n\n" + md_table(vhdr, vbody))
            if plots:
                tag = prefix + ("vendor" if fallback else rp.slug(num))
                dist = rp.distribution(tab, prs, protos, out / f"{tag}_distribution.png", label)
                image(dist, f"speedup distribution per baseline ({label})")
                if dist is not None:
                    rep.headline_images.append((dist, f"speedup distribution per baseline ({label})"))
                hnum, hden = ("torch", "vendor_best") if fallback else (num, "vendor_best")
                for p in protos:
                    image(hm.heatmaps(ratios(tab, p, hnum, hden), out / f"{tag}_heatmap_{p}.png",
                                      f"{p}: {hnum} / {hden}"), f"{p}: speedup of {hnum} over {hden} over (M, N), per K")
                vf = rp.vs_flops(tab, prs, protos, out / f"{tag}_vs_flops.png", label)
                image(vf, f"speedup against FLOPs ({label})")
                if vf is not None:
                    rep.headline_images.append((vf, f"speedup against FLOPs ({label})"))
                fl = ["vendor_best", "torch"] if fallback else [num, "vendor_best"]
                image(rp.floor_fraction(tab, fl, protos, out / f"{tag}_floor.png"),
                      f"fraction of the roofline floor (floor_ms / time_ms) per shape: {', '.join(fl)}")
        if claim_data is not None:
            num = None if fallback else names[0]
            joined = claims_join(tab, claim_data, num)
            of = num or "vendor_best"
            emit(f"### Beside CUDA-L2's published ratios\n\n**{CLAIM_LABEL}**: CUDA-L2's kernels over each baseline, "
                 f"measured by CUDA-L2 on its own H100 with its host-timed harness — not our measurement. "
                 f"**measured**: {of} over the same baseline, in our rows"
                 + (" (no kernel of ours here: what choosing the best vendor path gives)" if fallback else "")
                 + f". Shapes both have: {len({j['mnk'] for j in joined})}.\n")
            if joined:
                hdr = ["protocol", "vs", "shapes", f"{CLAIM_LABEL}: arith. mean − 1", "measured: arith. mean − 1",
                       "claim geomean", "measured geomean"]
                body = []
                for p in protos:
                    for b in CUDA_L2_COLS:
                        js = [j for j in joined if j["protocol"] == p and j["baseline"] == b]
                        if js:
                            sc, sm = Stats.of(j["claim"] for j in js), Stats.of(j["measured"] for j in js)
                            body.append([p, b, str(sc.n), _pct(sc.amean - 1), _pct(sm.amean - 1),
                                         f"{sc.geomean:.3f}", f"{sm.geomean:.3f}"])
                emit(md_table(hdr, body))
                csv_path = out / f"{prefix}claims_vs_measured.csv"
                with open(csv_path, "w", newline="") as fh:
                    w = csv.DictWriter(fh, ["protocol", "baseline", "mnk", "claim", "measured", "of"])
                    w.writeheader()
                    w.writerows(joined)
                p0 = joined[0]["protocol"]
                ph = ["shape"] + [f"{b}: claim / measured" for b in CUDA_L2_COLS]
                per = {}
                for j in joined:
                    if j["protocol"] == p0:
                        per.setdefault(j["mnk"], {})[j["baseline"]] = f"{j['claim']:.3f} / {j['measured']:.3f}"
                emit(f"Per shape, {p0} ({CLAIM_LABEL} / measured; all protocols in `{csv_path.name}`):\n\n"
                     + md_table(ph, [[m] + [d.get(b, "–") for b in CUDA_L2_COLS] for m, d in per.items()]))
                if plots:
                    image(rp.claims_scatter(joined, out / f"{prefix}claims_vs_measured.png", CLAIM_LABEL, of),
                          f"{CLAIM_LABEL} against measured ({of}), per shape")
            else:
                emit("_No (shape, protocol) in both: the claims cover offline and server only._\n")

    # Comparisons: explicit --compare A B, else every further identity group against the first.
    comps: list[tuple[str, list, str, list]] = []
    if compare_files:
        a, b = map(Path, compare_files)
        comps.append((_label(a, files[a]), files[a], _label(b, files[b]), files[b]))
    elif len(groups) > 1:
        gl = list(groups.values())
        first = [r for p in gl[0] for r in files[p]]
        for g in gl[1:]:
            comps.append((", ".join(p.name for p in gl[0]), first, ", ".join(p.name for p in g),
                          [r for p in g for r in files[p]]))
    for la, ra, lb, rb in comps:
        recs = compare(ra, rb)
        hdr = ["protocol", "candidate", "shared shapes", "geomean B/A", "arith. mean", "median", "min", "share < 1.0"]
        emit(f"## Comparison on shared shapes\n\nA = {la}\n\nB = {lb}\n\nRatio = speed in B / speed in A "
             f"(> 1: B faster).\n\n" + (md_table(hdr, [[r["protocol"], r["candidate"], str(r["n"]), f"{r['geomean']:.3f}",
                                                         f"{r['amean']:.3f}", f"{r['median']:.3f}", f"{r['min']:.3f}",
                                                         f"{r['share_below']:.2f}"] for r in recs])
                                         if recs else "_No (shape, protocol, candidate) in both._\n"))

    vtext = ("**Verdict** (per protocol: speed of ours over vendor_best per shape, geometric mean over shapes)\n\n"
             + ("\n".join(f"- {v}" for v in rep.verdict) if rep.verdict
                else "_No shape with both a candidate and vendor_best measured._") + "\n")
    md.insert(verdict_at, vtext)
    parts.insert(verdict_at, ("md", vtext))
    rep.markdown.write_text("\n".join(md))
    rep.html.write_text(_html(parts))
    return rep


def _html(parts: list[tuple[str, str]]) -> str:
    body = []
    for kind, payload in parts:
        if kind == "md":
            body.append(md_to_html(payload))
        else:
            path, cap = payload.split("\t", 1)
            data = base64.b64encode(Path(path).read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(cap)}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{html.escape(cap)}</figcaption></figure>")
    # a wide table scrolls in its own box and long names wrap, so at phone width the page never scrolls sideways
    # and no text runs into other text (tests/report/test_report_browser.py checks it in a headless browser)
    css = ("body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}table{border-collapse:collapse;"
           "margin:.5em 0;display:block;max-width:100%;overflow-x:auto}td,th{border:1px solid #ccc;padding:2px 6px;"
           "font-size:13px}td.num{text-align:right}p,li,h1,h2,h3,figcaption{overflow-wrap:anywhere}"
           "img{max-width:100%;height:auto}figcaption{font-size:13px;color:#444}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>gemmrl report</title>"
            f"<style>{css}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


README_BEGIN, README_END = "<!-- report:begin -->", "<!-- report:end -->"


def write_readme_block(rep: Report, readme: str | Path, command: str) -> None:
    """Replace the block between README_BEGIN and README_END in ``readme`` with the report's headline tables and
    its distribution and FLOPs plots (image paths relative to the README). The file is left untouched, and
    ReportError raised, where the markers are missing."""
    readme = Path(readme)
    text = readme.read_text()
    if text.count(README_BEGIN) != 1 or text.count(README_END) != 1 or text.index(README_BEGIN) > text.index(README_END):
        raise ReportError(f"{readme}: needs one '{README_BEGIN}' line followed by one '{README_END}' line to "
                          "write the report into (add them where the results section goes)")
    base = readme.resolve().parent

    def rel(p: Path) -> str:
        return os.path.relpath(Path(p).resolve(), base)

    body = [f"Generated by `{command}` from result rows only (full report: `{rel(rep.markdown)}`, "
            f"`{rel(rep.html)}`).\n", *rep.headline]
    body += [f"![{cap}]({rel(p)})" for p, cap in rep.headline_images]
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(head + README_BEGIN + "\n" + "\n\n".join(x.strip() for x in body) + "\n" + README_END + tail)
