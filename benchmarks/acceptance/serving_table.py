"""The serving bar's done-criteria table from a `gemmrl bench --library` run: per shape, gemmrl.mm over vendor_best in each
protocol (first run), what served it, and whether it stays more than 2% slower after the noise rule's 3
re-measurements; geomeans per protocol and shape class (decode M <= 32 on the Triton-family bar set, off-grid models).

    python benchmarks/acceptance/serving_table.py benchmarks/results/<gemmrl-mm run>.csv [--out table.md]
"""

from __future__ import annotations

import argparse
import math
import statistics
from pathlib import Path

from gemmrl.measure.bench import noise_rule_below
from gemmrl.results import read_rows
from gemmrl.summary import ratios, table

BAR = 0.02


def geo(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    rows = read_rows(args.csv)
    protos = sorted({r["protocol"] for r in rows})
    rat = ratios(rows, "gemmrl", "vendor_best")
    tab = table(rows)
    below = set(noise_rule_below(rows, "gemmrl", "vendor_best", margin=BAR))
    labels = {r["mnk"]: r.get("label", "") for r in rows}
    shapes = sorted({r["mnk"] for r in rows}, key=lambda m: tuple(int(x) for x in m.split("_")))
    out = [f"# gemmrl.mm against vendor_best ({', '.join(Path(p).name for p in args.csv)})", "",
           "Speedup = vendor_best time / gemmrl time (first run). `below` = more than 2% slower after the noise rule "
           "(median of 3 interleaved re-measurements).", ""]
    out.append("| class | protocol | shapes | geomean | min | max | below the 2% bar (noise rule) |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    classes = {"decode (the Triton-family bar's 20)": lambda m: labels.get(m, "").startswith("decode"),
               "off-grid models (40)": lambda m: not labels.get(m, "").startswith("decode"), "all": lambda m: True}
    for cname, pred in classes.items():
        for p in protos:
            xs = [v for (pp, _, _, m), v in rat.items() if pp == p and pred(m)]
            nb = sum(1 for (m, pp) in below if pp == p and pred(m))
            if xs:
                out.append(f"| {cname} | {p} | {len(xs)} | {geo(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} | {nb} |")
    out += ["", "| shape | label | " + " | ".join(f"{p} x | {p} served" for p in protos) + " | below |",
            "|---|---|" + "---:|---|" * len(protos) + "---|"]
    for m in shapes:
        cells = []
        for p in protos:
            key = next((k for k in rat if k[0] == p and k[3] == m), None)
            g = next((r for k, by in tab.items() if k[0] == p and k[3] == m for c, r in by.items() if c == "gemmrl"), None)
            served = (g.get("algo", "").split("; ")[1 if p == "graph" else 0].split("=", 1)[-1] if g else "")
            cells += [f"{rat[key]:.3f}" if key else "-", served.split(" (")[0][:60]]
        b = ",".join(p for (mm, p) in sorted(below) if mm == m)
        out.append(f"| {m} | {labels.get(m, '')} | " + " | ".join(cells) + f" | {b} |")
    text = "\n".join(out) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
