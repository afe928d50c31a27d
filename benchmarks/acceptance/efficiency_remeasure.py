"""Search efficiency with DESIGN.md's noise rule: each method's winners chosen on the screen, valued in another run.

    python benchmarks/acceptance/efficiency_remeasure.py --test HELD_OUT_SCREEN.csv... --judge POLICY.json... --plan     # CPU
    python benchmarks/acceptance/efficiency_remeasure.py --test ... --judge ... --measure ROWS.csv [--repeats 3]          # GPU
    python benchmarks/acceptance/efficiency_remeasure.py --test ... --judge ... --report ROWS.csv [--md OUT.md] [--csv OUT.csv]

The search-efficiency table (benchmarks/acceptance/policy_efficiency.py) values every method on the screen that chose it, and the
exhaustive sweep's gain there is a maximum over ~80-100 noisy measurements per shape: on the held-out 50 its summed
log-gain is 0.455 (geomean 1.009), and most of what a 15%-budget policy misses is single arms 1-2% ahead of the
rest. DESIGN.md: "A winner is chosen on one run and reported from another". So here every method picks its arm per
shape on the screen (search/efficiency.picks: the exhaustive sweep, each --judge policy's greedy order, the cost
model, and --random-draws random orders, at each --budget), and all the picked arms of a shape are then timed together
beside the screen's references (cuBLAS and cuBLASLt heuristic, both layouts) in --repeats interleaved rounds
(evaluate.evaluate_group, graph and cold, --timing); an arm's value is its median reward over the rounds, and a
method's share is its summed max(0, value) over the sweep's (search/efficiency.remeasured_shares).

--measure appends one row per (shape, round, arm) to ROWS.csv as it goes and resumes from it (a shape's rounds done
are skipped); --limit-s stops starting new shapes after that many seconds. --report prints the table (and the
screen-valued shares of the same picks, which reproduce benchmarks/acceptance/policy_efficiency.py's figures).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.search.efficiency import keyed_orders, picks, remeasured_shares  # noqa: E402
from gemmrl.search.policy import RLPolicy  # noqa: E402
from gemmrl.search.proposer import spec_key  # noqa: E402
from gemmrl.search.replay import REFERENCES, load_tables  # noqa: E402

FIELDS = ("mnk", "round", "arm", "label", "reward", "speedup_graph", "speedup_cold", "failure", "wall_s", "gpu",
          "git_sha", "timing")


def budgets(text: str) -> list[str]:
    out = [b.strip() for b in text.split(",") if b.strip()]
    for b in out:
        kind, _, val = b.partition(":")
        try:
            ok = kind in ("arms", "gpu") and float(val) > 0
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"--budget {b!r}: use arms:N or gpu:FRACTION (a comma list for several)")
    if not out:
        raise ValueError("--budget: none given (e.g. arms:4,gpu:0.15)")
    return out


def plan(args):
    """(tables in a fixed order, {budget: picks per method}, {mnk: [arm indices to re-measure, every budget's]})."""
    tab = load_tables(args.test)
    tables = [tab[k] for k in sorted(tab)]
    rankers = {"costmodel": keyed_orders(RLPolicy(init_temp=args.temp))}
    for f in args.judge:
        rankers[Path(f).stem] = keyed_orders(RLPolicy.load(f))
    chosen = {b: picks(tables, rankers, b, random_draws=args.random_draws, seed=args.seed) for b in budgets(args.budget)}
    arms = {t.problem.mnk: sorted({d[j] for per in chosen.values() for draws in per.values() for d in draws
                                   if d[j] is not None}) for j, t in enumerate(tables)}
    return tables, chosen, arms


def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def measure(args, tables, arms) -> int:
    import torch

    from gemmrl.measure.evaluate import GroupRequest, evaluate_group
    from gemmrl.results import git_sha
    from gemmrl.timing import TimingConfig

    if not torch.cuda.is_available():
        print("--measure needs a CUDA GPU (plan and report run anywhere)", file=sys.stderr)
        return 2
    out = Path(args.measure)
    done = {(r["mnk"], int(r["round"])) for r in read_rows(out)}
    timing = TimingConfig().quick() if args.timing == "quick" else TimingConfig()
    gpu, sha = torch.cuda.get_device_name(0), git_sha()
    new = not out.is_file()
    t0 = time.monotonic()
    todo = [t for t in tables if arms[t.problem.mnk]]
    with open(out, "a", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS)
        if new:
            w.writeheader()
        for n, t in enumerate(todo):
            if time.monotonic() - t0 > args.limit_s:
                print(f"--limit-s {args.limit_s}: stopped before shape {n + 1} of {len(todo)}", flush=True)
                break
            idx = arms[t.problem.mnk]
            for rnd in range(args.repeats):
                if (t.problem.mnk, rnd) in done:
                    continue
                k = rnd % len(idx)
                order = idx[k:] + idx[:k]   # rotated per round: no arm is always timed first
                specs = tuple(t.arms[i].spec for i in order)
                got = evaluate_group(GroupRequest(t.problem, specs, ("graph", "cold"), REFERENCES, timing, seed=rnd))
                for i, ev in zip(order, got["evaluations"]):
                    sp = ev.get("speedup") or {}
                    w.writerow({"mnk": t.problem.mnk, "round": rnd, "arm": i, "label": spec_key(t.arms[i].spec),
                                "reward": ev.get("reward", ""), "speedup_graph": sp.get("graph", ""),
                                "speedup_cold": sp.get("cold", ""), "failure": ev.get("failure", "") or "",
                                "wall_s": round(got["wall_s"], 3), "gpu": gpu, "git_sha": sha, "timing": args.timing})
                fh.flush()
            print(f"{n + 1}/{len(todo)} {t.problem.mnk}: {len(idx)} arms x {args.repeats} rounds "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


def report(args, tables, chosen, arms) -> int:
    rows = read_rows(Path(args.report))
    vals: dict[tuple[str, int], list[float]] = {}
    for r in rows:
        rew = float(r["reward"]) if r["reward"] not in ("", None) else -math.inf  # a failed arm gains nothing
        vals.setdefault((r["mnk"], int(r["arm"])), []).append(rew)
    missing = [(t.problem.mnk, i) for t in tables for i in arms[t.problem.mnk] if (t.problem.mnk, i) not in vals]
    if missing:
        print(f"{len(missing)} picked arms have no re-measured reward in {args.report} (e.g. {missing[:3]}): run "
              "--measure to the end first (it resumes)", file=sys.stderr)
        return 2
    med = {k: statistics.median(v) for k, v in vals.items()}
    rounds = "/".join(map(str, sorted({len(v) for v in vals.values()})))
    lines = [f"{len(tables)} shapes, picked arms re-measured in {rounds} rounds ({args.report}); random: "
             f"{args.random_draws} draws.", "",
             "| budget | method | share of the sweep's log-gain, re-measured | on the screen (chosen there) | geomean |",
             "|---|---|---:|---:|---:|"]
    table = []
    for b, per in chosen.items():
        got = remeasured_shares(tables, per, lambda t, i: med[(t.problem.mnk, i)])
        for m, d in got.items():
            lines.append(f"| {b} | {m} | {d['share']:.3f} | {d['screen_share']:.3f} | {d['geomean']:.4f} |")
            table.append({"method": m, "budget": b, "shapes": len(tables), "rounds": rounds,
                          "share_remeasured": round(d["share"], 4), "share_screen": round(d["screen_share"], 4),
                          "log_gain_remeasured": round(d["log_gain"], 5), "geomean_remeasured": round(d["geomean"], 5)})
    print("\n".join(lines))
    if args.md:
        Path(args.md).write_text("\n".join(lines) + "\n")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, list(table[0]))
            w.writeheader()
            w.writerows(table)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test", nargs="+", required=True, help="the held-out screens (gemmrl select CSVs)")
    ap.add_argument("--judge", nargs="*", default=[], help="policy files; each is a method named by its stem")
    ap.add_argument("--budget", default="arms:4,gpu:0.15",
                    help="comma list of arms:N (the first N proposals) or gpu:FRACTION (of the sweep's GPU time)")
    ap.add_argument("--random-draws", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--temp", type=float, default=0.15, help="the cost model's temperature (RLPolicy init_temp)")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--plan", action="store_true", help="print how many arms each shape needs re-measured")
    what.add_argument("--measure", metavar="ROWS.csv")
    what.add_argument("--report", metavar="ROWS.csv")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timing", choices=("quick", "full"), default="quick")
    ap.add_argument("--limit-s", type=float, default=math.inf)
    ap.add_argument("--md")
    ap.add_argument("--csv")
    args = ap.parse_args(argv)
    missing = [p for p in args.test + args.judge if not Path(p).is_file()]
    if missing:
        ap.error(f"no such file(s): {', '.join(missing)}")
    try:
        budgets(args.budget)
    except ValueError as e:
        ap.error(str(e))
    tables, chosen, arms = plan(args)
    if args.plan:
        n = [len(v) for v in arms.values()]
        print(f"{len(tables)} shapes, {sum(n)} arms to re-measure (per shape {min(n)}-{max(n)}, "
              f"{sum(x > 0 for x in n)} shapes with any), x {args.repeats} rounds")
        for b, per in chosen.items():
            for m, draws in per.items():
                print(f"  {b} {m}: {sum(i is not None for i in draws[0])} shapes with a generated pick (draw 0)")
        return 0
    if args.measure:
        return measure(args, tables, arms)
    return report(args, tables, chosen, arms)


if __name__ == "__main__":
    sys.exit(main())
