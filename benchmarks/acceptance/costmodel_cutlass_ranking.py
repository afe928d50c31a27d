"""How well the cost model ranks CUTLASS configs on committed CUTLASS screens (``gemmrl select --family cutlass``
rows), under several values of one cost-model constant: per (shape, protocol) the Spearman rank correlation between
the model's estimate (warm L2 for graph) and the measured time over the CUTLASS candidates screened, and the top-k
regret (the best measured time among the model's k best / the best measured time).

    python benchmarks/acceptance/costmodel_cutlass_ranking.py SCREEN.csv[.gz] ... [--param pingpong_overlap --values 0,0.5,1]

Prints one line per value: shapes x protocols, median Spearman, geomean top-1 and top-4 regret, and the share of
cells whose measured best is a ping-pong config that the model's top 4 hold.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.kernels import cutlass_sm90 as cs  # noqa: E402
from gemmrl.problem import parse_mnk  # noqa: E402
from gemmrl.results import read_rows  # noqa: E402
from gemmrl.search import costmodel as cm  # noqa: E402
from gemmrl.summary import usable  # noqa: E402


def cells(rows) -> dict[tuple[str, str], dict[str, float]]:
    """(mnk, protocol) -> CUTLASS candidate name (config:knobs) -> its median time (ms) over the rows."""
    acc: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in rows:
        c = str(r.get("candidate", ""))
        if not c.startswith(cs.PREFIX) or not usable(r) or r["protocol"] not in ("graph", "cold"):
            continue
        acc.setdefault((r["mnk"], r["protocol"]), {}).setdefault(c[len(cs.PREFIX):], []).append(float(r["time_ms"]))
    return {k: {c: statistics.median(ts) for c, ts in by.items()} for k, by in acc.items() if len(by) >= 4}


def score(cell_times: dict, params: cm.CostParams) -> dict[str, float]:
    rho, r1, r4, pp_best, pp_hit = [], [], [], 0, 0
    for (mnk, proto), by in cell_times.items():
        p = parse_mnk(mnk)
        names = sorted(by)
        est = []
        for n in names:
            cfg, knobs = cs.parse_name(n)
            est.append(cm.estimate_cutlass(cfg, knobs, p.with_(layout=cfg.layout), warm_l2=proto == "graph",
                                           params=params).seconds)
        meas = [by[n] for n in names]
        rho.append(cm.spearman(est, meas))
        order = sorted(range(len(names)), key=lambda i: (est[i], names[i]))
        best = min(meas)
        r1.append(meas[order[0]] / best)
        r4.append(min(meas[i] for i in order[:4]) / best)
        winner = min(range(len(names)), key=lambda i: meas[i])
        if names[winner].startswith("pingpong"):
            pp_best += 1
            pp_hit += winner in order[:4]
    gm = lambda xs: math.exp(statistics.fmean(math.log(x) for x in xs))  # noqa: E731
    return {"cells": len(rho), "spearman_median": statistics.median(rho), "regret1": gm(r1), "regret4": gm(r4),
            "pingpong_best": pp_best, "pingpong_best_in_top4": pp_hit}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("screens", nargs="+")
    ap.add_argument("--param", default="pingpong_overlap")
    ap.add_argument("--values", default="0,0.5,1")
    args = ap.parse_args(argv)
    by = cells(read_rows(args.screens))
    if not by:
        print("no (shape, protocol) with 4 or more usable CUTLASS rows in these files", file=sys.stderr)
        return 2
    print(f"| {args.param} | cells | median Spearman | top-1 regret | top-4 regret | best is ping-pong | of those in top 4 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for v in (float(x) for x in args.values.split(",")):
        s = score(by, replace(cm.DEFAULT, **{args.param: v}))
        print(f"| {v:g} | {s['cells']} | {s['spearman_median']:.3f} | {s['regret1']:.3f} | {s['regret4']:.3f} | "
              f"{s['pingpong_best']} | {s['pingpong_best_in_top4']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
