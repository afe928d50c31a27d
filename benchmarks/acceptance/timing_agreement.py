"""Do two bench runs of the same shapes agree? Per shape and protocol, the speedup of our fastest candidate over
vendor_best in each run, their ratio, and the geomeans; and each run's wall time per shape (from the row
timestamps). Used to check `gemmrl bench --timing quick` beside the default timing before the library's re-measure
uses it.

    python benchmarks/acceptance/timing_agreement.py A.csv[.gz] B.csv[.gz] [--names default,quick] [--md OUT.md]

Only shapes and protocols both runs completed (every vendor path verified and timed) are compared. "Ours" is the
fastest verified row of a candidate that is not a vendor path (triton-sel, cutlass-sel, gemmrl, ...).
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.results import read_rows  # noqa: E402
from gemmrl.summary import AGGREGATES, BASELINES, usable  # noqa: E402

VENDOR = set(BASELINES) | set(AGGREGATES)


def speedups(rows: list[dict]) -> dict[tuple[str, str], float]:
    """{(mnk, protocol): t_vendor_best / t_ours} where every vendor path the run measured anywhere ran (a shape cut
    off part-way is left out)."""
    t: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        if not usable(r) or r.get("reason"):   # verified, timed, first run, no recheck
            continue
        k = (r["mnk"], r["protocol"])
        x = float(r["time_ms"])
        t.setdefault(k, {})
        t[k][r["candidate"]] = min(x, t[k].get(r["candidate"], math.inf))
    paths = {c for d in t.values() for c in d if c in BASELINES}
    out = {}
    for k, d in t.items():
        ours = [x for c, x in d.items() if c not in VENDOR]
        if paths and paths <= set(d) and ours:
            out[k] = min(d[c] for c in paths) / min(ours)
    return out


def seconds_per_shape(rows: list[dict]) -> dict[str, float]:
    """Wall seconds from a shape's first row to the next shape's first row (the last shape has none)."""
    first: dict[str, datetime] = {}
    for r in rows:
        ts = str(r.get("timestamp") or "")
        if ts:
            first.setdefault(r["mnk"], datetime.fromisoformat(ts.replace("Z", "+00:00")))
    order = sorted(first, key=first.get)
    return {m: (first[n] - first[m]).total_seconds() for m, n in zip(order, order[1:])}


def compare(a: list[dict], b: list[dict]) -> dict:
    sa, sb = speedups(a), speedups(b)
    both = sorted(set(sa) & set(sb), key=lambda k: (k[1], k[0]))
    wa, wb = seconds_per_shape(a), seconds_per_shape(b)
    timed = sorted(set(wa) & set(wb))
    per = [(k, sa[k], sb[k]) for k in both]
    geo = {}
    for proto in sorted({k[1] for k in both}):
        xs = [(x, y) for k, x, y in per if k[1] == proto]
        geo[proto] = (math.exp(sum(math.log(x) for x, _ in xs) / len(xs)),
                      math.exp(sum(math.log(y) for _, y in xs) / len(xs)), len(xs),
                      max(abs(y / x - 1) for x, y in xs))
    return {"per": per, "geo": geo, "seconds": (sum(wa[m] for m in timed), sum(wb[m] for m in timed), len(timed))}


def markdown(res: dict, names: tuple[str, str]) -> str:
    a, b = names
    out = [f"| protocol | shapes | {a}: ours / vendor_best (geomean) | {b} | {b} / {a} | largest per-shape gap |",
           "|---|---:|---:|---:|---:|---:|"]
    for proto, (ga, gb, n, worst) in res["geo"].items():
        out.append(f"| {proto} | {n} | {ga:.3f} | {gb:.3f} | {gb / ga:.4f} | {worst:.3f} |")
    sa, sb, n = res["seconds"]
    if n:
        out.append(f"\nWall time over the {n} shapes both runs timed in full: {a} {sa:.0f} s, {b} {sb:.0f} s "
                   f"({sb / sa:.2f}x).")
    out.append(f"\n| mnk | protocol | {a} | {b} | {b} / {a} |\n|---|---|---:|---:|---:|")
    out += [f"| {k[0]} | {k[1]} | {x:.3f} | {y:.3f} | {y / x:.3f} |" for k, x, y in res["per"]]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--names", default="A,B", help="the two runs' names in the table, comma-separated")
    ap.add_argument("--md", type=Path, help="also write the table here")
    args = ap.parse_args(argv)
    names = tuple(x.strip() for x in args.names.split(","))
    if len(names) != 2:
        ap.error(f"--names takes two names, got {args.names!r}")
    for p in (args.a, args.b):
        if not p.is_file():
            ap.error(f"{p}: no such file (a gemmrl bench CSV)")
    res = compare(read_rows([args.a]), read_rows([args.b]))
    if not res["per"]:
        raise SystemExit("no shape and protocol that both runs completed with our candidate and a vendor path")
    text = markdown(res, names)
    print(text, end="")
    if args.md:
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
