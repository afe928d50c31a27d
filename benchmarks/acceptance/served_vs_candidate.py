"""Does gemmrl.mm serve a generated kernel as fast as the bench timed it as a candidate? Per cell a library entry
serves, the kernel's time through gemmrl.mm in a measure run (`gemmrl bench --library`) against the same config's
time as a bench candidate in the re-measure that selected it, each over its own run's vendor_best so that a drift of
the whole run cancels:

    x = (t_gemmrl.mm / vendor_best) in the measure run  /  (t_candidate / vendor_best) in the re-measure

x > 1: the served path is slower than the candidate was. Geomean per protocol, and the cells furthest from 1.

    python benchmarks/acceptance/served_vs_candidate.py --pair REMEASURE.csv.gz[,REMEASURE2.csv.gz] MEASURE.csv.gz [--pair ...]
                                          [--family cutlass] [--worst 6]

First-run rows only (no noise-rule rechecks). A cell counts where the measure row's served kernel (its ``algo``, as
dispatch writes it) is a config some re-measure row of the pair timed in the same protocol.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gemmrl.library import served_desc  # noqa: E402
from gemmrl.results import read_rows  # noqa: E402
from gemmrl.summary import usable  # noqa: E402
from library_measure import geomean  # noqa: E402


def _first_runs(paths: list[str]) -> list[dict]:
    return [r for r in read_rows(paths) if usable(r)]


def _vendor_best(rows: list[dict]) -> dict[tuple[str, str], float]:
    return {(r["protocol"], r["mnk"]): float(r["time_ms"]) for r in rows if r["candidate"] == "vendor_best"}


def cells(remeasures: list[str], measure: str, family: str = "cutlass") -> list[dict]:
    """One record per (protocol, shape) the measure run served with a ``family`` kernel that the re-measures timed."""
    rem = _first_runs(remeasures)
    vb0 = _vendor_best(rem)
    timed = {}
    for r in rem:
        if r["candidate"].startswith(family) and (r["protocol"], r["mnk"]) in vb0:
            timed[(r["protocol"], r["mnk"], r["algo"])] = float(r["time_ms"])
    rows = _first_runs([measure])
    vb1 = _vendor_best(rows)
    out = []
    for r in rows:
        if r["candidate"] != "gemmrl" or not (desc := served_desc(r)).startswith(f"{family}:"):
            continue
        algo = desc.split(" (", 1)[0][len(family) + 1:]
        key = (r["protocol"], r["mnk"], algo)
        if key not in timed or (r["protocol"], r["mnk"]) not in vb1:
            continue
        t0, t1 = timed[key], float(r["time_ms"])
        v0, v1 = vb0[(r["protocol"], r["mnk"])], vb1[(r["protocol"], r["mnk"])]
        out.append({"protocol": r["protocol"], "mnk": r["mnk"], "algo": algo, "x": (t1 / v1) / (t0 / v0),
                    "raw": t1 / t0, "t_candidate_us": t0 * 1e3, "t_served_us": t1 * 1e3,
                    "vendor_best_us": (v0 * 1e3, v1 * 1e3)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", nargs=2, action="append", required=True, metavar=("REMEASURES", "MEASURE"),
                    help="comma-separated re-measure file(s) and the measure run of the library built from them")
    ap.add_argument("--family", default="cutlass", choices=("cutlass", "triton"))
    ap.add_argument("--worst", type=int, default=6, help="list this many cells furthest above 1 per protocol")
    args = ap.parse_args(argv)
    recs = []
    for rems, meas in args.pair:
        recs += cells(rems.split(","), meas, args.family)
    if not recs:
        print(f"no cell served by a {args.family} kernel that its re-measure also timed: are these the re-measure(s) "
              "and the `gemmrl bench --library` run of the library built from them?", file=sys.stderr)
        return 2
    print(f"| protocol | cells | geomean x (served / candidate, each over its run's vendor_best) | raw time ratio |")
    print("|---|---:|---:|---:|")
    for proto in sorted({r["protocol"] for r in recs}):
        rs = [r for r in recs if r["protocol"] == proto]
        print(f"| {proto} | {len(rs)} | {geomean([r['x'] for r in rs]):.4f} | {geomean([r['raw'] for r in rs]):.4f} |")
    print()
    print("| protocol | shape | x | candidate us | served us | vendor_best us (re-measure -> measure) |")
    print("|---|---|---:|---:|---:|---|")
    for proto in sorted({r["protocol"] for r in recs}):
        for r in sorted((r for r in recs if r["protocol"] == proto), key=lambda r: -r["x"])[:args.worst]:
            v0, v1 = r["vendor_best_us"]
            print(f"| {proto} | {r['mnk']} | {r['x']:.3f} | {r['t_candidate_us']:.2f} | {r['t_served_us']:.2f} | "
                  f"{v0:.2f} -> {v1:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
