"""Train the RL policy on measured H100 screens and measure its search efficiency on shapes it never trained on.

    python benchmarks/acceptance/policy_efficiency.py --train SCREEN.csv... --save src/gemmrl/policies/h100.json
    python benchmarks/acceptance/policy_efficiency.py --train SCREEN.csv... --test HELD_OUT_SCREEN.csv... --out RESULT.csv
    python benchmarks/acceptance/policy_efficiency.py --train SCREEN.csv... --cv 2 --out RESULT.csv
    python benchmarks/acceptance/policy_efficiency.py --test HELD_OUT_SCREEN.csv... --judge POLICY.json... [--floor] --out RESULT.csv

Training: GRPO on the screens' measured rewards (search/efficiency.train_replay). Judged: on the test screens (or
each cross-validation fold), the exhaustive sweep of the screened (pruned) space against the policy's greedy order,
the untrained policy (= the cost model's ranking) and random orders, at budgets of 1/4/8 arms and 5/10/15% of the
sweep's GPU time per shape. Writes one CSV row per (fold, method, budget) and prints a markdown table.
--judge: saved policies judged as they are (no training; method = the file's stem), beside the cost model;
--floor: each also with the live proposer's family floor (every family in the first 4), as METHOD+floor.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.search.efficiency import (evaluate_methods, floored, keyed_orders, split_shapes, sweep_row,  # noqa: E402
                                     train_replay)
from gemmrl.search.policy import RLPolicy  # noqa: E402
from gemmrl.search.replay import load_tables  # noqa: E402

BUDGETS = ("arms:1", "arms:4", "arms:8", "gpu:0.05", "gpu:0.10", "gpu:0.15")


def train(tables, args, seed):
    pol = RLPolicy(init_temp=args.temp, lr=args.lr)
    t0 = time.time()
    curve = train_replay(pol, tables, epochs=args.epochs, group=args.group, seed=seed)
    print(f"trained on {len(tables)} shapes, {args.epochs} epochs of groups of {args.group} in {time.time() - t0:.1f} s; "
          f"mean sampled reward {curve[0]:.4f} -> {curve[-1]:.4f}", flush=True)
    return pol


def judge(pol, tables, fold, seed, policies=None, floor=False):
    rankers = {"costmodel": keyed_orders(RLPolicy(init_temp=pol.state.init_temp if pol else 0.15))}
    if pol is not None:
        rankers["rl"] = keyed_orders(pol)
    for name, p in (policies or {}).items():
        rankers[name] = keyed_orders(p)
    if floor:
        rankers.update({f"{n}+floor": floored(r) for n, r in list(rankers.items())})
    rows = [sweep_row(tables)] + evaluate_methods(tables, rankers, BUDGETS, random_draws=200, seed=seed)
    return [{"fold": fold, "shapes": len(tables), "method": r.method, "budget": r.budget,
             "share_of_sweep_log_gain": round(r.share, 4), "share_of_sweep_gpu_time": round(r.gpu_share, 4),
             "shapes_at_95pct": r.shapes_at_95, "library_geomean": round(r.geomean_speedup, 4)} for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", nargs="+", default=[])
    ap.add_argument("--test", nargs="*")
    ap.add_argument("--cv", type=int, default=0)
    ap.add_argument("--save")
    ap.add_argument("--out")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--temp", type=float, default=0.15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--judge", nargs="+", default=[], help="saved policy files to judge on --test as they are")
    ap.add_argument("--floor", action="store_true", help="also judge every method with the family floor")
    args = ap.parse_args()
    if not args.train and not (args.judge and args.test):
        ap.error("give --train SCREEN.csv... (to train), or --judge POLICY.json... with --test SCREEN.csv...")
    tr = load_tables(args.train) if args.train else {}
    rows = []
    if args.judge:
        te = load_tables(args.test)
        pols = {Path(f).stem: RLPolicy.load(f) for f in args.judge}
        for name, p in pols.items():
            seen = len(set(p.state.trained_on) & set(te))
            if seen:
                print(f"note: {name} trained on {seen} of the {len(te)} test shapes")
        rows += judge(None, [te[k] for k in sorted(te)], "judge", args.seed, pols, args.floor)
    elif args.test:
        te = load_tables(args.test)
        overlap = set(te) & set(tr)
        if overlap:
            print(f"note: {len(overlap)} test shapes are also in the training screens; they are left out of training")
        pol = train([t for k, t in tr.items() if k not in te], args, args.seed)
        rows += judge(pol, [te[k] for k in sorted(te)], "test", args.seed)
        if args.save:
            pol.save(args.save)
    if args.cv:
        grid = [k for k in tr if len(tr[k].arms) > 60]   # shapes screened in both families
        for i, fold in enumerate(split_shapes(grid, args.cv, args.seed)):
            pol = train([t for k, t in tr.items() if k not in fold], args, args.seed + i)
            rows += judge(pol, [tr[k] for k in sorted(fold)], f"cv{i}", args.seed)
    if args.save and not args.test:
        pol = train(list(tr.values()), args, args.seed)
        pol.save(args.save)
        print(f"saved {args.save}")
    if rows:
        print("| fold | method | budget | share of sweep log-gain | share of sweep GPU time | shapes at 95% | library geomean |")
        print("|---|---|---|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['fold']} | {r['method']} | {r['budget']} | {r['share_of_sweep_log_gain']:.3f} | "
                  f"{r['share_of_sweep_gpu_time']:.3f} | {r['shapes_at_95pct']}/{r['shapes']} | {r['library_geomean']:.4f} |")
        if args.out:
            with open(args.out, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
