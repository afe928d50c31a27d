"""What live tuning does to the policy, replayed at no GPU cost: learning rates and advantage epsilons compared.

    python benchmarks/acceptance/policy_live_replay.py --store TRIALS.sqlite[.gz] --runs grid1000-part1of5 grid1000-part2of5 \
        --start src/gemmrl/policies/h100.json --test HELD_OUT_SCREEN.csv... [--train SCREEN.csv...] \
        --settings 0.05:0.001 0.01:0.02 --out RESULT.csv

Two replays per setting (lr:eps), each from the --start policy with a fresh optimizer, judged on the --test screens
by the share of the exhaustive sweep's log-gain its first 4 proposals reach and the share it reaches with 15% of the
sweep's GPU time (search/efficiency.py):
- ``live``: the groups a `gemmrl tune` run measured (--store, --runs; the proposals and rewards as stored, in their
  order), one GRPO step each, as the live loop took them; groups at the --test shapes are left out (the grid runs
  tuned every grid shape, the held-out ones too: a policy that learned from them would be judged on its training
  data), unless --keep-test-shapes;
- ``screens`` (with --train): live-style groups on measured screens, the policy's greedy top 4 of each shape
  rewarded from the screen, --passes passes over the shapes.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from gemmrl.search import policy as P  # noqa: E402
from gemmrl.search.efficiency import evaluate_methods, keyed_orders  # noqa: E402
from gemmrl.search.loop import write_summary  # noqa: E402
from gemmrl.search.proposer import spec_key  # noqa: E402
from gemmrl.search.replay import load_tables  # noqa: E402


JUDGED = ("arms:4", "gpu:0.15")   # the two budgets: the first 4 proposals, 15% of the sweep's GPU time


def shares(pol: P.RLPolicy, tests) -> dict[str, float]:
    """Share of the sweep's log-gain ``pol`` reaches on ``tests`` at each budget of JUDGED."""
    got = {r.budget: r.share for r in evaluate_methods(tests, {"m": keyed_orders(pol)}, JUDGED, random_draws=1)
           if r.method == "m"}
    return {"first4_share": got["arms:4"], "gpu15_share": got["gpu:0.15"]}


def _row(replay: str, lr, eps, groups: int, got: dict[str, float], anchor=None) -> dict:
    return {"replay": replay, "lr": lr, "eps": eps, "anchor_l2": "" if anchor is None else anchor, "groups": groups,
            **got}


def _said(got: dict[str, float]) -> str:
    return f"first-4 share {got['first4_share']:.3f}, at 15% of the sweep's GPU time {got['gpu15_share']:.3f}"


def live_groups(store_path: Path, runs: list[str]) -> list[tuple[str, list[tuple[str, float]]]]:
    """[(mnk, [(candidate key, reward), ...]), ...] per stored group of ``runs``, in the order they were stored."""
    from gemmrl.search.run_export import open_copy

    groups: dict[str, tuple[str, list]] = {}
    with open_copy(store_path) as st:
        for row in st.outcomes():
            if row["run"] not in runs:
                continue
            g = json.loads(row["record"] or "{}").get("group") or f"{row['run']}:{row['mnk']}"
            r = row["reward"] if row["reward"] is not None and row["verdict"] == "ok" else P.FAIL_REWARD
            groups.setdefault(g, (row["mnk"], []))[1].append((row["key"], float(r)))
    return list(groups.values())


def without_shapes(groups, shapes) -> list:
    """The live groups at shapes not in ``shapes`` (the held-out ones), in their order."""
    return [g for g in groups if g[0] not in shapes]


def replay_live(start: P.RLPolicy, groups, problems, lr: float, eps: float,
                anchor_l2: float | None = None) -> tuple[P.RLPolicy, int]:
    pol = copy.deepcopy(start)
    pol.opt, pol.adv_eps = P.Adam(lr), eps
    if anchor_l2 is not None:
        pol.anchor_here(anchor_l2)
    n = 0
    for mnk, got in groups:
        specs, x = pol.actions(problems[mnk])
        index = {spec_key(s): i for i, s in enumerate(specs)}
        picked = [(index[k], r) for k, r in got if k in index]
        if len(picked) < 2:
            continue
        pol.step(x, [i for i, _ in picked], [r for _, r in picked])
        n += 1
    return pol, n


def replay_screens(start: P.RLPolicy, tables, lr: float, eps: float, passes: int, seed: int) -> P.RLPolicy:
    pol = copy.deepcopy(start)
    pol.opt, pol.adv_eps = P.Adam(lr), eps
    rng = random.Random(seed)
    for t in tables:
        pol.set_actions(t.problem, [a.spec for a in t.arms])
    for _ in range(passes):
        order = list(tables)
        rng.shuffle(order)
        for t in order:
            _, x = pol.actions(t.problem)
            chosen = list(np.argsort(-pol.logits(x), kind="stable")[:4])
            pol.step(x, chosen, [t.arms[i].reward if t.arms[i].ok else P.FAIL_REWARD for i in chosen])
    return pol


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", type=Path)
    ap.add_argument("--runs", nargs="*", default=[])
    ap.add_argument("--start", type=Path, required=True, help="the policy both replays start from")
    ap.add_argument("--test", nargs="+", required=True, help="held-out screens the policies are judged on")
    ap.add_argument("--train", nargs="*", default=[], help="screens for the live-style replay on screens")
    ap.add_argument("--settings", nargs="+", default=["0.05:0.001", "0.01:0.02"], help="lr:eps pairs")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=0, help="processes computing the candidate sets (default CPUs - 1)")
    ap.add_argument("--keep-test-shapes", action="store_true",
                    help="also replay the live groups at the --test shapes (judged on its own training data)")
    ap.add_argument("--save", type=Path, metavar="DIR", help="save each replayed policy here (live_lrX_epsY.json)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if bool(args.store) != bool(args.runs):
        ap.error("--store and --runs go together")
    settings = []
    for s in args.settings:
        try:
            lr, eps, *anchor = (float(v) for v in s.split(":"))
            if len(anchor) > 1:
                raise ValueError
        except ValueError:
            ap.error(f"--settings takes lr:eps or lr:eps:anchor_l2 such as 0.01:0.02 or 0.01:0.02:0.05, got {s!r}")
        settings.append((lr, eps, anchor[0] if anchor else None))
    te = load_tables(args.test)
    tests = [te[k] for k in sorted(te)]
    start = P.RLPolicy.load(args.start)
    got = shares(start, tests)
    rows = [_row("none", "", "", 0, got)]
    print(f"start {args.start.name}: {_said(got)} on {len(tests)} held-out shapes", flush=True)
    if args.store:
        from gemmrl.problem import parse_mnk

        groups = live_groups(args.store, args.runs)
        if not groups:
            raise SystemExit(f"{args.store}: no outcomes of the runs {', '.join(args.runs)}")
        if not args.keep_test_shapes:
            n_all = len(groups)
            groups = without_shapes(groups, te)
            print(f"{n_all - len(groups)} of {n_all} live groups at the held-out shapes left out", flush=True)
        by = {m: parse_mnk(m) for m in sorted({m for m, _ in groups})}   # fp16, acc fp32: the grid runs' problems
        start.warm(list(by.values()), jobs=args.jobs or None)
        for lr, eps, anchor in settings:
            pol, n = replay_live(start, groups, by, lr, eps, anchor)
            got = shares(pol, tests)
            rows.append(_row("live", lr, eps, n, got, anchor))
            print(f"live groups ({n}) at lr {lr} eps {eps}{'' if anchor is None else f' anchored l2 {anchor}'}: "
                  f"{_said(got)}", flush=True)
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                pol.save(args.save / f"live_lr{lr}_eps{eps}{'' if anchor is None else f'_anchor{anchor}'}.json")
    if args.train:
        tr = load_tables(args.train)
        tables = [tr[k] for k in sorted(tr) if k not in te]
        for lr, eps, _ in settings:
            pol = replay_screens(start, tables, lr, eps, args.passes, args.seed)
            got = shares(pol, tests)
            rows.append(_row(f"screens x{args.passes}", lr, eps, args.passes * len(tables), got))
            print(f"greedy groups on {len(tables)} screens x{args.passes} at lr {lr} eps {eps}: {_said(got)}", flush=True)
    if args.out:
        write_summary(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
