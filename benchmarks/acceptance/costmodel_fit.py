"""Rank correlation of the cost model with measured screen times, and a random-search fit of its constants.

    python benchmarks/acceptance/costmodel_fit.py benchmarks/results/<screen>.csv [--fit N] [--protocol graph,cold]

Per (shape, protocol) of the screen rows (``gemmrl select``): Spearman between ``costmodel.estimate`` (warm L2
in ``graph``) and the measured times of the quick-checked configs. Prints the per-protocol median and mean and
the share of shapes >= 0.6. ``--fit N`` tries N random perturbations of ``CostParams`` (log-uniform, x0.33..x3)
and prints the best constants found by the mean Spearman (fit and report on disjoint halves of the shapes).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import asdict, fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.kernels.triton_gemm.configs import H100, parse_config  # noqa: E402
from gemmrl.problem import ProblemError, parse_mnk, read_shapes  # noqa: E402
from gemmrl.results import read_rows  # noqa: E402
from gemmrl.search.costmodel import CUTLASS_ONLY, DEFAULT, CostParams, estimate, spearman  # noqa: E402


def groups(paths, protocols):
    out = {}
    for r in read_rows(paths):
        if not r["candidate"].startswith("triton:") or r.get("verified") != "true" or r["protocol"] not in protocols:
            continue
        t = float(r["time_ms"])
        if not math.isfinite(t):
            continue
        p = parse_mnk(r["mnk"], dtype=r.get("dtype") or "fp16", acc=r.get("acc") or "fp32", layout=r.get("layout") or "tn")
        out.setdefault((r["mnk"], r["protocol"], p.layout), (p, []))[1].append((parse_config(r["algo"]), t))
    return {k: v for k, v in out.items() if len(v[1]) >= 5}


def score(gs, params, keys=None):
    rho = {}
    for key in keys or gs:
        p, items = gs[key]
        pred = [estimate(c, p, H100, key[1] == "graph", params).seconds for c, _ in items]
        rho[key] = spearman(pred, [t for _, t in items])
    return rho


def regret(gs, params, keys=None, k=4):
    """Per group: measured time of the best of the model's top-k / the best measured time (1.0 = no loss)."""
    out = {}
    for key in keys or gs:
        p, items = gs[key]
        ranked = sorted(items, key=lambda ct: estimate(ct[0], p, H100, key[1] == "graph", params).seconds)
        out[key] = min(t for _, t in ranked[:k]) / min(t for _, t in items)
    return out


def report(rho, label, reg=None):
    for proto in sorted({k[1] for k in rho}):
        xs = [v for k, v in rho.items() if k[1] == proto]
        print(f"{label} {proto}: shapes {len(xs)}  median {statistics.median(xs):.3f}  mean {statistics.fmean(xs):.3f}  "
              f">=0.6: {sum(x >= 0.6 for x in xs)}/{len(xs)}"
              + (f"  top-4 regret geomean {math.exp(statistics.fmean(math.log(v) for k, v in reg.items() if k[1] == proto)):.3f}"
                 if reg else ""))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--protocol", default="graph,cold")
    ap.add_argument("--fit", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--all", action="store_true", help="fit on every shape (no held-out half)")
    ap.add_argument("--exclude-shapes", help="a shapes file (M_N_K a line, # comments) whose shapes are left out, e.g. "
                    "the held-out shapes a policy is judged on")
    ap.add_argument("--fixed", default="", help="constants the fit leaves at their current values, e.g. pdl_us "
                    "(one the screens cannot see: no PDL config in them)")
    args = ap.parse_args(argv)
    fixed = {f for f in args.fixed.split(",") if f}
    unknown = fixed - {f.name for f in fields(CostParams)}
    if unknown:
        ap.error(f"--fixed: no such constant {sorted(unknown)} (CostParams has {[f.name for f in fields(CostParams)]})")
    fixed |= CUTLASS_ONLY  # Triton screens cannot see them (benchmarks/acceptance/costmodel_cutlass_ranking.py scores those)
    gs = groups(args.csv, args.protocol.split(","))
    if args.exclude_shapes:
        if not Path(args.exclude_shapes).is_file():
            ap.error(f"--exclude-shapes {args.exclude_shapes}: no such file (a shapes file: M_N_K a line)")
        try:
            out = {p.mnk for p in read_shapes(args.exclude_shapes)}
        except ProblemError as e:
            ap.error(f"--exclude-shapes: {e}")
        gs = {k: v for k, v in gs.items() if k[0] not in out}
        print(f"left out the shapes of {args.exclude_shapes}: {len(gs)} groups remain")
    rho = score(gs, DEFAULT)
    report(rho, "current", regret(gs, DEFAULT))
    worst = sorted(rho.items(), key=lambda kv: kv[1])[:8]
    print("lowest:", ", ".join(f"{k[0]}/{k[1]} {v:.2f}" for k, v in worst))
    if args.fit:
        rng = random.Random(args.seed)
        keys = sorted(gs)
        rng.shuffle(keys)
        fit_keys, held = (keys, keys) if args.all else (keys[::2], keys[1::2])
        best, best_s = DEFAULT, statistics.fmean(score(gs, DEFAULT, fit_keys).values()) - statistics.fmean(
            math.log(v) for v in regret(gs, DEFAULT, fit_keys).values())
        for i in range(args.fit):
            cand = replace(best, **{f.name: min(3 * getattr(DEFAULT, f.name), max(getattr(DEFAULT, f.name) / 3,
                                    getattr(best, f.name) * math.exp(rng.uniform(-0.5, 0.5))))
                                    for f in fields(CostParams) if f.name not in fixed and rng.random() < 0.5})
            s = statistics.fmean(score(gs, cand, fit_keys).values()) - statistics.fmean(
                math.log(v) for v in regret(gs, cand, fit_keys).values())
            if s > best_s:
                best, best_s = cand, s
                print(f"  {i}: fit mean {s:.3f}")
        report(score(gs, best, held), "held-out (fitted)", regret(gs, best, held))
        report(score(gs, DEFAULT, held), "held-out (default)", regret(gs, DEFAULT, held))
        print({k: round(v, 4) for k, v in asdict(best).items()})


if __name__ == "__main__":
    main()
