"""The Triton-family bar's done-criteria from the committed CSVs: the re-measured selection (``gemmrl bench --triton-from``)
against vendor_best per shape class and protocol, the fraction of the floor reached, achieved GB/s on the
decode shapes, and the cost model's rank correlation on the selection run (``gemmrl select``).

    python benchmarks/acceptance/selection_table.py REMEASURE.csv --select SELECT.csv [--md OUT.md]

Classes: ``min(M,N) <= 256`` (bar: geomean >= 1.10 cold, >= 1.05 graph), ``all dims >= 4096`` (>= 0.97 in both),
and the rest. In protocol p the candidate compared is the one selected in p (``triton-sel:<protocols>``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemmrl.search.selection import selected_for  # noqa: E402
from gemmrl.results import read_rows  # noqa: E402
from gemmrl.summary import Stats, usable  # noqa: E402

BARS = {"small": {"cold": 1.10, "graph": 1.05}, "large": {"cold": 0.97, "graph": 0.97}}
LABEL = {"small": "min(M,N) <= 256", "large": "all dims >= 4096", "other": "other"}


def shape_class(m: int, n: int, k: int) -> str:
    if min(m, n) <= 256:
        return "small"
    if min(m, n, k) >= 4096:
        return "large"
    return "other"


def per_shape(rows):
    vendor = {(r["protocol"], r["mnk"]): r for r in rows if usable(r) and r["candidate"] == "vendor_best"}
    ours = {(r["protocol"], r["mnk"]): r for r in rows
            if usable(r) and not r.get("members") and selected_for(r["candidate"], r["protocol"])}
    out = []
    for key in sorted(set(vendor) & set(ours), key=lambda k: (k[0], k[1])):
        v, o = vendor[key], ours[key]
        m, n, k = (int(x) for x in key[1].split("_"))
        floor = float(o.get("floor_ms") or "nan")
        out.append({"protocol": key[0], "mnk": key[1], "M": m, "N": n, "K": k, "cls": shape_class(m, n, k),
                    "ours_ms": float(o["time_ms"]), "vendor_ms": float(v["time_ms"]), "vendor": v.get("members", ""),
                    "speedup": float(v["time_ms"]) / float(o["time_ms"]), "config": o.get("algo", ""),
                    "layout": o.get("layout", ""), "floor_ms": floor,
                    "ours_floor": floor / float(o["time_ms"]), "vendor_floor": floor / float(v["time_ms"])})
    unverified = [r for r in rows if r["candidate"].startswith("triton-sel:") and r.get("verified") != "true"]
    return out, unverified


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("remeasure", nargs="+")
    ap.add_argument("--select", nargs="*", default=[])
    ap.add_argument("--md", help="also write the tables as markdown here")
    args = ap.parse_args(argv)
    rows = read_rows(args.remeasure)
    recs, unverified = per_shape(rows)
    lines = []
    emit = lines.append
    emit(f"Re-measured selection: {', '.join(Path(p).name for p in args.remeasure)}; "
         f"{len({r['mnk'] for r in recs})} shapes; selected configs that failed the battery: {len(unverified)}")
    for r in unverified[:10]:
        emit(f"  - {r['mnk']} {r['protocol']} {r['candidate']}: {r.get('reason', '')[:160]}")
    emit("")
    emit("| class | protocol | shapes | geomean | median | min | max | share < 1.0 | bar | met |")
    emit("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for cls in ("small", "large", "other"):
        for proto in ("graph", "cold"):
            xs = [r["speedup"] for r in recs if r["cls"] == cls and r["protocol"] == proto]
            if not xs:
                continue
            s = Stats.of(xs)
            bar = BARS.get(cls, {}).get(proto)
            emit(f"| {LABEL[cls]} | {proto} | {s.n} | {s.geomean:.3f} | {s.median:.3f} | {s.min:.3f} | {max(xs):.3f} | "
                 f"{s.share_below:.2f} | {bar if bar else ''} | {'' if bar is None else ('yes' if s.geomean >= bar else 'no')} |")
    emit("")
    emit("Fraction of the roofline floor reached (floor / time), median per class:")
    emit("")
    emit("| class | protocol | ours | vendor_best |")
    emit("|---|---|---:|---:|")
    for cls in ("small", "large", "other"):
        for proto in ("graph", "cold"):
            rs = [r for r in recs if r["cls"] == cls and r["protocol"] == proto]
            if rs:
                emit(f"| {LABEL[cls]} | {proto} | {statistics.median(r['ours_floor'] for r in rs):.3f} | "
                     f"{statistics.median(r['vendor_floor'] for r in rs):.3f} |")
    dec = [r for r in recs if r["M"] < 64]
    if dec:
        emit("")
        emit("Decode shapes: achieved bandwidth (A, B, C bytes once / time), GB/s:")
        emit("")
        emit("| shape | protocol | ours GB/s | vendor_best GB/s | speedup | vendor path | our config |")
        emit("|---|---|---:|---:|---:|---|---|")
        for r in sorted(dec, key=lambda r: (r["protocol"], r["N"], r["K"], r["M"])):
            b = 2.0 * (r["M"] * r["K"] + r["K"] * r["N"] + r["M"] * r["N"])
            emit(f"| {r['mnk']} | {r['protocol']} | {b / r['ours_ms'] / 1e6:.0f} | {b / r['vendor_ms'] / 1e6:.0f} | "
                 f"{r['speedup']:.3f} | {r['vendor']} | {r['layout']} {r['config']} |")
    emit("")
    emit("Every shape (speedup = vendor_best time / ours):")
    emit("")
    emit("| shape | class | protocol | ours ms | vendor_best ms | speedup | ours/floor | vendor/floor | config |")
    emit("|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in sorted(recs, key=lambda r: (r["protocol"], r["speedup"])):
        emit(f"| {r['mnk']} | {r['cls']} | {r['protocol']} | {r['ours_ms']:.4g} | {r['vendor_ms']:.4g} | "
             f"{r['speedup']:.3f} | {r['ours_floor']:.3f} | {r['vendor_floor']:.3f} | {r['layout']} {r['config']} |")
    if args.select:
        from costmodel_fit import DEFAULT, groups, regret, score

        gs = groups(args.select, ["graph", "cold"])
        rho, reg = score(gs, DEFAULT), regret(gs, DEFAULT)
        emit("")
        emit(f"Cost model vs measured screen times ({', '.join(Path(p).name for p in args.select)}), per "
             "(shape, layout): Spearman over the screened configs, top-4 regret = best measured among the model's 4 "
             "best / best measured:")
        emit("")
        emit("| protocol | (shape, layout) groups | median Spearman | mean | share >= 0.6 | top-4 regret geomean |")
        emit("|---|---:|---:|---:|---:|---:|")
        for proto in ("graph", "cold"):
            ks = [k for k in rho if k[1] == proto]
            if ks:
                xs = [rho[k] for k in ks]
                g = math.exp(statistics.fmean(math.log(reg[k]) for k in ks))
                emit(f"| {proto} | {len(ks)} | {statistics.median(xs):.3f} | {statistics.fmean(xs):.3f} | "
                     f"{sum(x >= 0.6 for x in xs) / len(xs):.2f} | {g:.3f} |")
    text = "\n".join(lines)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
