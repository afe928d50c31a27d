"""Search efficiency on measured tables: how much of an exhaustive sweep's log-gain a proposer finds, for how much
of the sweep's GPU time.

Log-gain of a shape for a set of tried arms: ``max(0, best reward among them)`` -- what the library gains there
(it serves the vendor path where nothing won). A method's share at a budget: the sum over shapes of its log-gain
divided by the sum of the exhaustive sweep's (every arm of the table tried). Budgets are per shape, in arms or in
a fraction of the sweep's GPU time at that shape (arms are taken in the method's order while the budget lasts;
the first arm is always taken).

Methods: ``rl`` (the policy's greedy ranking, trained by ``train_replay`` on other shapes only), ``costmodel``
(its prior alone, i.e. the untrained policy), ``random`` (the expectation over ``random_draws`` orderings).
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from .policy import FAIL_REWARD, RLPolicy, with_family_floor
from .replay import Table


def train_replay(policy: RLPolicy, tables: Sequence[Table], epochs: int = 60, group: int = 8, seed: int = 0,
                 progress: bool = False) -> list[float]:
    """GRPO on measured rewards: every epoch, for every shape (shuffled), ``group`` arms sampled without
    replacement from the policy (Gumbel top-k over its logits), rewarded from the table, one policy-gradient step
    with group-relative advantages. Returns the mean sampled reward per epoch."""
    rng = random.Random(seed)
    for t in tables:
        policy.set_actions(t.problem, [a.spec for a in t.arms])
    curve = []
    order = list(tables)
    for _ in range(epochs):
        rng.shuffle(order)
        got = []
        for t in order:
            specs, x = policy.actions(t.problem)
            z = policy.logits(x) + np.array([-math.log(-math.log(max(rng.random(), 1e-12))) for _ in specs])
            chosen = list(np.argsort(-z)[:group])
            rewards = [t.arms[i].reward if t.arms[i].ok else FAIL_REWARD for i in chosen]
            policy.step(x, chosen, rewards)
            policy.state.trained_on.append(t.problem.mnk)
            got.append(float(np.mean(rewards)))
        curve.append(float(np.mean(got)))
    return curve


def gain(table: Table, order: Sequence[int], n: int) -> float:
    best = max((table.arms[i].reward for i in order[:n] if table.arms[i].ok), default=-math.inf)
    return max(0.0, best)


def arms_within(table: Table, order: Sequence[int], fraction: float) -> int:
    """How many arms of ``order`` fit in ``fraction`` of the sweep's GPU time (at least one)."""
    budget, spent = fraction * table.sweep_cost_s, 0.0
    for n, i in enumerate(order):
        spent += table.arms[i].cost_s
        if spent > budget:
            return max(1, n)
    return len(order)


def orders(policy: RLPolicy, table: Table) -> list[int]:
    policy.set_actions(table.problem, [a.spec for a in table.arms])
    _, x = policy.actions(table.problem)
    return list(np.argsort(-policy.logits(x), kind="stable"))


def online_orders(policy: RLPolicy, group: int = 4, rounds: int = 6, lr: float | None = None
                  ) -> Callable[[Table], list[int]]:
    """The order in which the tuning loop would try a table's arms: ``group`` proposals at a time (the policy's
    greedy top among the untried), each group rewarded and followed by one GRPO step on that shape, for
    ``rounds`` groups; after that the rest in the last policy's order. The policy is copied per shape, so nothing
    learned on one test shape reaches another."""
    def order(table: Table) -> list[int]:
        pol = copy.deepcopy(policy)
        if lr is not None:
            pol.opt.lr = lr
        pol.set_actions(table.problem, [a.spec for a in table.arms])
        _, x = pol.actions(table.problem)
        tried: list[int] = []
        for _ in range(rounds):
            z = pol.logits(x)
            free = [i for i in np.argsort(-z, kind="stable") if i not in set(tried)][:group]
            if not free:
                break
            tried += free
            pol.step(x, tried, [table.arms[i].reward if table.arms[i].ok else FAIL_REWARD for i in tried])
        z = pol.logits(x)
        return tried + [i for i in np.argsort(-z, kind="stable") if i not in set(tried)]

    return order


@dataclass(frozen=True)
class Row:
    method: str
    budget: str
    share: float              # of the sweep's summed log-gain
    gpu_share: float          # of the sweep's summed GPU time
    shapes_at_95: int         # shapes where the method reached >= 95% of the sweep's gain (or both had none)
    geomean_speedup: float    # exp(mean log-gain): the library's speedup over vendor on these shapes


def evaluate_methods(tables: Sequence[Table], rankers: dict[str, Callable[[Table], list[int]]],
                     budgets: Iterable[str] = ("arms:1", "arms:4", "arms:8", "gpu:0.05", "gpu:0.10", "gpu:0.15"),
                     random_draws: int = 200, seed: int = 0) -> list[Row]:
    """One row per (method, budget). ``rankers``: method -> arm order for a table. ``random`` is added."""
    rng = random.Random(seed)
    sweep = [max(0.0, t.best) for t in tables]
    total_gain = sum(sweep)
    total_cost = sum(t.sweep_cost_s for t in tables)
    rand_orders = [[rng.sample(range(len(t.arms)), len(t.arms)) for t in tables] for _ in range(random_draws)]
    rows = []
    for budget in budgets:
        def n_for(t: Table, o: list[int], budget=budget) -> int:
            return budget_arms(t, o, budget)

        methods = {name: [[f(t) for t in tables]] for name, f in rankers.items()}
        methods["random"] = rand_orders
        for name, draws in methods.items():
            shares, costs, at95, geo = [], [], [], []
            for ords in draws:
                g = [gain(t, o, n_for(t, o)) for t, o in zip(tables, ords)]
                c = [sum(t.arms[i].cost_s for i in o[:n_for(t, o)]) for t, o in zip(tables, ords)]
                shares.append(sum(g) / total_gain if total_gain else 1.0)
                costs.append(sum(c) / total_cost)
                at95.append(sum(1 for gi, si in zip(g, sweep) if gi >= 0.95 * si - 1e-12))
                geo.append(math.exp(sum(g) / len(g)))
            rows.append(Row(name, budget, float(np.mean(shares)), float(np.mean(costs)), int(round(np.mean(at95))),
                            float(np.mean(geo))))
    return rows


def sweep_row(tables: Sequence[Table]) -> Row:
    g = [max(0.0, t.best) for t in tables]
    return Row("exhaustive", "all", 1.0, 1.0, len(tables), math.exp(sum(g) / len(g)))


def pick(table: Table, order: Sequence[int], n: int) -> int | None:
    """The arm a method would serve after trying ``order[:n]``: its best verified arm by the table's reward, or
    None where none gained (the library serves the vendor path there)."""
    ok = [i for i in order[:n] if table.arms[i].ok]
    if not ok:
        return None
    best = max(ok, key=lambda i: (table.arms[i].reward, -order.index(i)))
    return best if table.arms[best].reward > 0.0 else None


def budget_arms(table: Table, order: Sequence[int], budget: str) -> int:
    """How many arms of ``order`` a budget ("arms:N" or "gpu:FRACTION") lets a method try at ``table``."""
    kind, val = budget.split(":")
    if kind == "arms":
        return int(val)
    if kind == "gpu":
        return arms_within(table, order, float(val))
    raise ValueError(f"budget {budget!r}: use arms:N or gpu:FRACTION")


def picks(tables: Sequence[Table], rankers: dict[str, Callable[[Table], list[int]]], budget: str,
          random_draws: int = 20, seed: int = 0) -> dict[str, list[list[int | None]]]:
    """Per method, per draw, per table: the arm it would serve at ``budget`` (see :func:`pick`). ``exhaustive``
    (every arm tried) and, with ``random_draws`` > 0, ``random`` (that many orders, seeded) are added; other
    methods have one draw."""
    rng = random.Random(seed)

    def served(order_of: Callable[[Table], list[int]]) -> list[int | None]:
        return [pick(t, o, budget_arms(t, o, budget)) for t in tables for o in (order_of(t),)]

    out = {"exhaustive": [[pick(t, list(range(len(t.arms))), len(t.arms)) for t in tables]]}
    out.update({name: [served(f)] for name, f in rankers.items()})
    draws = [served(lambda t: rng.sample(range(len(t.arms)), len(t.arms))) for _ in range(random_draws)]
    if draws:
        out["random"] = draws
    return out


def remeasured_shares(tables: Sequence[Table], chosen: dict[str, list[list[int | None]]],
                      reward: Callable[[Table, int], float | None]) -> dict[str, dict[str, float]]:
    """DESIGN.md's noise rule applied to search efficiency: each method's picks (from :func:`picks`, chosen on the
    screen) valued by ``reward(table, arm)`` from a separate measurement (None or NaN: not re-measured, an error;
    -inf: it failed there). A shape's log-gain is max(0, re-measured reward) of its pick (0 where the pick is None: the vendor
    path); a method's share is its summed log-gain over the exhaustive sweep's, averaged over draws. Returns
    method -> {"share", "screen_share", "log_gain", "geomean"} (screen_share: the same picks valued on the screen)."""
    def value(t: Table, i: int | None, screen: bool) -> float:
        if i is None:
            return 0.0
        r = t.arms[i].reward if screen else reward(t, i)
        if r is None or math.isnan(r):
            raise ValueError(f"{t.problem.mnk}: arm {i} ({t.arms[i].spec.label()}) has no re-measured reward")
        return max(0.0, r)   # -inf: the pick failed when re-measured, and the vendor path is served

    sweep = chosen["exhaustive"][0]
    tot = sum(value(t, i, False) for t, i in zip(tables, sweep))
    tot_screen = sum(value(t, i, True) for t, i in zip(tables, sweep))
    out = {}
    for name, draws in chosen.items():
        gains = [sum(value(t, i, False) for t, i in zip(tables, d)) for d in draws]
        screen = [sum(value(t, i, True) for t, i in zip(tables, d)) for d in draws]
        g = float(np.mean(gains))
        out[name] = {"share": g / tot if tot > 0 else 1.0,
                     "screen_share": float(np.mean(screen)) / tot_screen if tot_screen > 0 else 1.0,
                     "log_gain": g, "geomean": math.exp(g / len(tables)) if tables else 1.0}
    return out


def keyed_orders(policy: RLPolicy) -> Callable[[Table], list[int]]:
    return lambda t: orders(policy, t)


def floored(ranker: Callable[[Table], list[int]], k: int = 4) -> Callable[[Table], list[int]]:
    """``ranker`` with the live proposer's family floor (``policy.with_family_floor``) at group size ``k``."""
    return lambda t: with_family_floor(ranker(t), lambda i: t.arms[i].spec.family, k)


def split_shapes(keys: Sequence[str], folds: int, seed: int) -> list[list[str]]:
    ks = sorted(keys)
    random.Random(seed).shuffle(ks)
    return [ks[i::folds] for i in range(folds)]


__all__ = ["train_replay", "evaluate_methods", "sweep_row", "orders", "keyed_orders", "floored", "online_orders",
           "split_shapes", "Row", "pick", "budget_arms", "picks", "remeasured_shares"]
