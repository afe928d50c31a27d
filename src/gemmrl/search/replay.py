"""Measured screens replayed: the policy's training ground and the search-efficiency table, at no GPU cost.

A screen (``gemmrl select``, ``search/screen.py``) times every config of a shape's pruned space in graph and cold,
beside the vendor references (cuBLAS and cuBLASLt heuristic, both layouts) in every chunk. ``load_tables`` turns
screen CSVs into one :class:`Table` per shape: for every (family, layout, config) its reward -- the mean over the
protocols of log(t_ref / t), t_ref the fastest reference row of that shape, protocol and file -- or a failure, and
the GPU time its screening cost. Files of different families (the Triton and the CUTLASS screens) measured the same
shapes in separate runs; each arm's reward is against the references of its own run.

GPU time of one arm in the screen protocol (``screen.SCREEN_TIMING``), charged as ``arm_cost_s``: a quick check
(one call and a reference comparison, ``QUICK_S``), graph replays of >= 1 ms of calls (5 timed and 1 warm-up) and
7 cold calls each behind an L2 flush (``FLUSH_S``). This is the model of what the sweep spends per arm; the live
loop records the device seconds it actually used.

``TableExecutor`` answers the tuning loop from a table (what the loop would have measured), so the proposers and
the loop run unchanged against real H100 numbers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..kernels.registry import of_candidate
from ..measure.evaluate import CandidateSpec
from ..problem import GemmProblem
from ..results import read_rows
from .executor import GroupResult, failed_record
from .policy import ACTIONS, FAIL_REWARD
from .proposer import spec_key

REFERENCES = ("cublas_tn", "cublas_nn", "cublaslt_heuristic_tn", "cublaslt_heuristic_nn")
PROTOCOLS = ("graph", "cold")
QUICK_S = 1.0e-3
FLUSH_S = 0.1e-3


def arm_cost_s(t_graph_s: float, t_cold_s: float) -> float:
    return QUICK_S + 6 * max(1.0e-3, t_graph_s) + 7 * (t_cold_s + FLUSH_S)


@dataclass(frozen=True)
class Arm:
    spec: CandidateSpec
    reward: float            # FAIL_REWARD when it failed the quick check or a protocol was not timed
    ok: bool
    cost_s: float
    speedup: tuple           # ((protocol, t_ref / t), ...)


@dataclass(frozen=True)
class Table:
    problem: GemmProblem
    arms: tuple[Arm, ...]

    @property
    def best(self) -> float:
        return max((a.reward for a in self.arms if a.ok), default=FAIL_REWARD)

    @property
    def sweep_cost_s(self) -> float:
        return sum(a.cost_s for a in self.arms)

    def by_key(self) -> dict[str, Arm]:
        return {spec_key(a.spec): a for a in self.arms}


def _spec(row: dict) -> CandidateSpec | None:
    """The policy's action a screen row measured (a config of a family the policy acts on), or None."""
    cand = row["candidate"]
    fam = of_candidate(cand)
    if fam is None or fam.name not in ACTIONS or not cand.startswith(fam.prefix):
        return None
    return CandidateSpec(fam.name, row.get("algo") or cand[len(fam.prefix):], name=cand,
                         layout=row.get("layout") or "tn")


def load_tables(paths: Iterable[str | Path], dtype: str = "fp16", acc: str = "fp32") -> dict[str, Table]:
    """mnk -> Table over every screen CSV in ``paths``."""
    refs: dict[tuple, float] = {}
    meas: dict[tuple, dict] = defaultdict(dict)   # (mnk, file) -> key -> {spec, protocol: t or None}
    for path in paths:
        for r in read_rows([Path(path)]):
            if r.get("dtype", dtype) != dtype or r.get("acc", acc) != acc or not str(r.get("info", "")).startswith("screen"):
                continue
            ok = str(r.get("verified")).lower() == "true" and r.get("time_ms") not in ("", None)
            t = float(r["time_ms"]) * 1e-3 if ok else None
            if r["candidate"] in REFERENCES:
                if t is not None:
                    k = (r["mnk"], str(path), r["protocol"])
                    refs[k] = min(refs.get(k, math.inf), t)
                continue
            spec = _spec(r)
            if spec is None:
                continue
            d = meas[(r["mnk"], str(path))].setdefault(spec_key(spec), {"spec": spec})
            d[r["protocol"]] = t
    arms: dict[str, list[Arm]] = defaultdict(list)
    for (mnk, path), keyed in meas.items():
        for d in keyed.values():
            ts = {p: d.get(p) for p in PROTOCOLS}
            rf = {p: refs.get((mnk, path, p)) for p in PROTOCOLS}
            ok = all(ts[p] and rf[p] for p in PROTOCOLS)
            sp = tuple((p, rf[p] / ts[p]) for p in PROTOCOLS) if ok else ()
            reward = sum(math.log(s) for _, s in sp) / len(sp) if ok else FAIL_REWARD
            cost = arm_cost_s(ts["graph"] or 1e-3, ts["cold"] or 1e-3)
            arms[mnk].append(Arm(d["spec"], reward, ok, cost, sp))
    out = {}
    for mnk, a in arms.items():
        M, N, K = (int(x) for x in mnk.split("_"))
        a.sort(key=lambda x: spec_key(x.spec))
        out[mnk] = Table(GemmProblem(M, N, K, dtype, acc), tuple(a))
    return out


class TableExecutor:
    """Evaluations read from measured tables instead of a GPU (``gpu_s``: the arm's screening cost)."""

    slots = 1

    def __init__(self, tables: dict[str, Table]):
        self.tables = tables
        self._keyed = {m: t.by_key() for m, t in tables.items()}

    def submit(self, problem: GemmProblem, specs: Sequence[CandidateSpec]) -> "Future[GroupResult]":
        fut: Future = Future()
        keyed = self._keyed.get(problem.mnk, {})
        evs, cost = [], 0.0
        for s in specs:
            arm = keyed.get(spec_key(s))
            if arm is None:
                evs.append(failed_record(problem, s, "error", "not measured in the replayed table"))
                continue
            cost += arm.cost_s
            if not arm.ok:
                evs.append(failed_record(problem, s, "rejected", "failed the screen's quick check"))
                continue
            evs.append({"mnk": problem.mnk, "candidate": s.label(), "failure": "", "reason": "", "build": {},
                        "graph_safe": True, "speedup": dict(arm.speedup), "reward": arm.reward, "rows": ()})
        fut.set_result(GroupResult(problem, tuple(evs), (), cost, "replay", "replay"))
        return fut

    def close(self) -> None:
        pass
