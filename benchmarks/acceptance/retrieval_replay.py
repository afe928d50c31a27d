"""Retrieval as the RL policy's first proposals, judged by replay on held-out screens (the retrieval run).

    python benchmarks/acceptance/retrieval_replay.py --test HELD_OUT_SCREEN.csv... --retrieve SCREENS... --policy POLICY.json \
        [--shapes 1,2,3,5] --out RESULT.csv

Per held-out shape, the Triton arms whose (config, layout) won on the k nearest screened shapes (``search.retrieve``;
winners on the held-out shapes themselves are dropped, so only neighbours count) go first, in retrieval order, then
the policy's own order. Judged like ``benchmarks/acceptance/policy_efficiency.py`` (share of the exhaustive sweep's log-gain at
1/4/8 arms and 15% of its GPU time), beside the policy alone and random orders; one CSV row per (method, budget).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.search.efficiency import evaluate_methods, keyed_orders, sweep_row  # noqa: E402
from gemmrl.search.policy import RLPolicy  # noqa: E402
from gemmrl.search.replay import Table, load_tables  # noqa: E402
from gemmrl.search.retrieve import expand, nearest, read_winners  # noqa: E402

BUDGETS = ("arms:1", "arms:4", "arms:8", "gpu:0.15")


def retrieved_first(base, table_w, k: int):
    """An arm order: the arms retrieved from the ``k`` nearest shapes' winners, then ``base``'s order."""
    def order(t: Table) -> list[int]:
        idx: dict[tuple[str, str], int] = {}
        for i, a in enumerate(t.arms):
            if a.spec.family == "triton":
                idx.setdefault((str(a.spec.payload), a.spec.layout), i)
        first: list[int] = []
        for c, lay in nearest(t.problem, table_w, k):
            for key in ((str(c), lay), (str(c), "nn" if lay == "tn" else "tn")):  # the layout it won in first
                if key in idx:
                    if idx[key] not in first:
                        first.append(idx[key])
                    break
        return first + [i for i in base(t) if i not in first]
    return order


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--test", nargs="+", required=True, help="held-out screens (Triton and CUTLASS)")
    ap.add_argument("--retrieve", nargs="+", required=True, help="screens (or globs) to retrieve winners from")
    ap.add_argument("--policy", default="src/gemmrl/policies/h100.json")
    ap.add_argument("--shapes", default="1,2,3,5", help="nearest shapes retrieved from, one method each")
    ap.add_argument("--per-shape", type=int, default=2)
    ap.add_argument("--draws", type=int, default=20, help="random orders averaged")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    tables = load_tables(a.test)
    held = set(tables)
    test_files = {str(Path(p).resolve()) for p in a.test}
    files = [f for f in expand(a.retrieve) if str(Path(f).resolve()) not in test_files]
    table_w = tuple(w for w in read_winners(files, a.per_shape) if w.mnk not in held)
    base = keyed_orders(RLPolicy.load(a.policy))
    rankers = {"policy": base}
    for k in (int(x) for x in a.shapes.split(",")):
        rankers[f"retrieved{k}+policy"] = retrieved_first(base, table_w, k)
    ts = list(tables.values())
    rows = [sweep_row(ts)] + evaluate_methods(ts, rankers, BUDGETS, random_draws=a.draws)
    out = [{"shapes": len(ts), "retrieved_from_shapes": len({w.mnk for w in table_w}), "method": r.method,
            "budget": r.budget, "share_of_sweep_log_gain": round(r.share, 4),
            "share_of_sweep_gpu_time": round(r.gpu_share, 4), "shapes_at_95pct": r.shapes_at_95} for r in rows]
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
    for r in out:
        print(f"{r['method']:20} {r['budget']:9} share {r['share_of_sweep_log_gain']:.3f} "
              f"gpu {r['share_of_sweep_gpu_time']:.3f} at95 {r['shapes_at_95pct']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
