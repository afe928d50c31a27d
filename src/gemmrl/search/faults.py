"""Planted faults for a tuning run, and the run's bookkeeping: which candidates a fault-survival run proposes, in
which groups, what each must come to, and the count of what the trials store holds afterwards.

A plan is ``n`` candidates laid out group by group (``group`` per group, shapes in turn: group ``g`` is shape
``g % S``, its round ``g // S``); a fraction of the positions, drawn with a seed, holds a planted fault, the
kinds dealt out in turn so that each kind comes up about equally often, and every other position the next good
candidate of its shape. ``PlanProposer`` hands the plan to :class:`~gemmrl.search.loop.Tuner`, one group at a time:
per shape the first ``k`` planned candidates it has no outcome for, so a resumed run proposes exactly what the
killed one had not stored. ``tally`` counts what the trials store holds against the plan.

Faults:
  ``cuda`` (GPU)  the planted CUDA sources of ``kernels/planted_cuda.py``: illegal_address -> cuda_fault, hang ->
                  timeout, huge_malloc -> oom, legacy_stream and device_sync -> rejected, syntax_error -> build.
  ``cpu``         Triton-source stand-ins that run under the Triton interpreter: ``crash`` (reads address 0: the
                  worker dies of SIGSEGV), ``hang`` (never returns: killed at the job's timeout), ``oom`` (asks
                  the allocator for 1 PiB), ``wrong`` (a Triton GEMM that drops the last K tile: the battery
                  rejects it), ``load_error`` (a syntax error: build).
Good candidates: the cost model's top Triton configs at each shape (GPU), small tiled Triton configs (CPU).
Every fault's source carries its kind and its number among its kind at the shape, so no two are one candidate.

Used by ``benchmarks/acceptance/fault_survival.py``; tests: ``tests/search/test_fault_survival.py``.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Sequence

from ..adversarial.planted_cuda import EXPECTED, planted_source
from ..kernels.triton_gemm.configs import H100, TiledConfig, valid
from ..kernels.triton_source import TritonSource
from ..measure.evaluate import CandidateSpec
from ..problem import GemmProblem
from .loop import payload_from, payload_text
from .policy import CostModelProposer, candidate_set
from .proposer import Context, Outcome, Proposal, spec_key

_HEAD = "# gemmrl fault-survival plant: {kind} #{v}\n"
_CPU_CODE = {
    "crash": "import ctypes\n\n\ndef gemm(a, b, c):\n    ctypes.string_at(0)  # address 0: SIGSEGV\n",
    "hang": "def gemm(a, b, c):\n    while True:  # never returns\n        pass\n",
    "oom": ("import torch\n\n\ndef gemm(a, b, c):\n    torch.empty(1 << 50, dtype=torch.uint8, device=a.device)  "
            "# 1 PiB\n"),
    "wrong": '''import triton
import triton.language as tl


@triton.jit
def _mm(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K - BK, BK):  # planted: the last K tile is never added
        kk = k0 + rk
        x = tl.load(a + rm[:, None] * sam + kk[None, :] * sak, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        y = tl.load(b + kk[:, None] * sbk + rn[None, :] * sbn, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm(a, b, c):
    M, K = a.shape
    N = b.shape[1]
    _mm[(triton.cdiv(M, 16), triton.cdiv(N, 16))](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0),
                                                  b.stride(1), c.stride(0), c.stride(1), BM=16, BN=16, BK=16)
''',
    "load_error": "import triton\n\n\ndef gemm(a, b, c)  # missing colon\n    pass\n",
}
CPU_EXPECTED = {"crash": "crash", "hang": "timeout", "oom": "oom", "wrong": "rejected", "load_error": "build"}
CUDA_KINDS = ("illegal_address", "hang", "huge_malloc", "legacy_stream", "device_sync", "syntax_error")
KILLS_WORKER = frozenset({"crash", "timeout", "cuda_fault"})   # verdicts the sandbox replaces the worker for


def fault_kinds(device: str) -> tuple[str, ...]:
    return tuple(CPU_EXPECTED) if device == "cpu" else CUDA_KINDS


def expected(kind: str, device: str) -> str:
    """The verdict a planted fault must be stored with ("ok" for a good candidate)."""
    if kind == "good":
        return "ok"
    if device == "cpu":
        return CPU_EXPECTED[kind]

    return EXPECTED[kind]


def fault_spec(kind: str, device: str, v: int = 0) -> CandidateSpec:
    """Planted fault ``kind``, number ``v`` of its kind at a shape (the number makes its source, so its key, new)."""
    name = f"fault:{kind}#{v}"
    if device == "cpu":
        if kind not in _CPU_CODE:
            raise ValueError(f"unknown CPU fault {kind!r}; one of {', '.join(_CPU_CODE)}")
        return CandidateSpec("triton_source", TritonSource(_HEAD.format(kind=kind, v=v) + _CPU_CODE[kind], "gemm",
                                                           "nn", name=name), layout="nn")

    src = planted_source(kind, layout="tn")
    return CandidateSpec("cuda", replace(src, code=src.code + "\n" + _HEAD.replace("#", "//", 1).format(kind=kind, v=v),
                                         name=name), layout="tn")


def tiny_triton(problem: GemmProblem, n: int) -> list[CandidateSpec]:
    """``n`` small tiled Triton configs valid at ``problem``, both layouts in turn, fewest programs x K steps first
    (the Triton interpreter's time goes with them: 16x16x16 tiles at 33_65_129 take ~20x as long as 32x64x64)."""
    def steps(t: tuple) -> int:
        return -(-problem.M // t[0]) * -(-problem.N // t[1]) * -(-problem.K // t[2])

    out = []
    tiles = sorted(itertools.product((16, 32, 64), repeat=3), key=lambda t: (steps(t), t[0] * t[1] * t[2]))
    for (bm, bn, bk), w, s, g in itertools.product(tiles, (1, 2, 4), (2, 3), (1, 8)):
        c = TiledConfig(BM=bm, BN=bn, BK=bk, warps=w, stages=s, group_m=g)
        for layout in ("nn", "tn"):
            if valid(c, problem.with_(layout=layout), H100)[0]:
                out.append(CandidateSpec("triton", str(c), name=f"triton:{c}:{layout}", layout=layout))
    if len(out) < n:
        raise ValueError(f"only {len(out)} small Triton configs at {problem.mnk}, {n} asked for: use fewer candidates "
                         "or more shapes")
    return out[:n]


def top_triton(problem: GemmProblem, n: int, exclude: frozenset = frozenset()) -> list[CandidateSpec]:
    """The cost model's ``n`` best Triton configs at ``problem`` (both layouts), skipping the keys in ``exclude``."""
    top = 24
    while True:
        cm = CostModelProposer(partial(candidate_set, top=top, explore=0, cutlass=False))
        ranked = [s for s in cm.ranked(problem) if spec_key(s) not in exclude]
        if len(ranked) >= n or top >= 384:
            return ranked[:n]
        top *= 2


@dataclass(frozen=True)
class Planned:
    """One planned candidate: its place in the run (``index``; the shape's ``round`` and the group's ``slot``),
    ``kind`` ("good" or the fault's kind) and the verdict it must be stored with."""

    index: int
    problem: GemmProblem
    round: int
    slot: int
    kind: str
    expected: str
    spec: CandidateSpec

    @property
    def key(self) -> str:
        return spec_key(self.spec)

    def to_dict(self) -> dict:
        p, s = self.problem, self.spec
        return dict(index=self.index, M=p.M, N=p.N, K=p.K, dtype=p.dtype, acc=p.acc, problem_layout=p.layout,
                    round=self.round, slot=self.slot, kind=self.kind, expected=self.expected, family=s.family,
                    payload=payload_text(s), name=s.name, layout=s.layout)

    @staticmethod
    def from_dict(d: dict) -> "Planned":
        p = GemmProblem(d["M"], d["N"], d["K"], d["dtype"], d["acc"], d["problem_layout"])
        spec = CandidateSpec(d["family"], payload_from(d["family"], d["payload"]), d["name"], d["layout"])
        return Planned(d["index"], p, d["round"], d["slot"], d["kind"], d["expected"], spec)


def make_plan(problems: Sequence[GemmProblem], n: int, fault_frac: float, seed: int, group: int, device: str,
              good: Callable[[GemmProblem, int], list[CandidateSpec]],
              kinds: Sequence[str] | None = None) -> list[Planned]:
    """``n`` candidates over ``problems`` in groups of ``group``; ``round(n * fault_frac)`` of them planted faults at
    seeded positions, the ``kinds`` dealt out in turn (default: every kind of ``device``)."""
    if not 0.0 <= fault_frac <= 1.0 or n < 1 or group < 1 or not problems:
        raise ValueError(f"need n >= 1, group >= 1, 0 <= fault_frac <= 1 and shapes (n={n}, group={group}, "
                         f"fault_frac={fault_frac}, {len(problems)} shapes)")
    kinds = tuple(kinds or fault_kinds(device))
    rng = random.Random(seed)
    at = {pos: kinds[i % len(kinds)] for i, pos in enumerate(rng.sample(range(n), round(n * fault_frac)))}
    S = len(problems)
    where = [(i, problems[(i // group) % S], (i // group) // S, i % group) for i in range(n)]
    need = Counter(p.mnk for i, p, _, _ in where if i not in at)
    goods = {p.mnk: iter(good(p, need[p.mnk])) for p in problems if need[p.mnk]}
    seen: Counter = Counter()
    plan = []
    for i, p, r, slot in where:
        kind = at.get(i, "good")
        if kind == "good":
            spec = next(goods[p.mnk])
        else:
            spec = fault_spec(kind, device, seen[(p.mnk, kind)])
            seen[(p.mnk, kind)] += 1
        plan.append(Planned(i, p, r, slot, kind, expected(kind, device), spec))
    return plan


def save_plan(plan: Sequence[Planned], path) -> None:
    with open(path, "w") as f:
        json.dump([p.to_dict() for p in plan], f, indent=0)


def load_plan(path) -> list[Planned]:
    with open(path) as f:
        return [Planned.from_dict(d) for d in json.load(f)]


class PlanProposer:
    """Proposes the plan: per shape, the first ``k`` planned candidates that have no outcome yet."""

    name = "planted"

    def __init__(self, plan: Sequence[Planned]):
        self.by: dict[str, list[Planned]] = {}
        for p in sorted(plan, key=lambda p: p.index):
            self.by.setdefault(p.problem.mnk, []).append(p)

    def propose(self, ctx: Context, k: int, rng: Any = None) -> list[Proposal]:
        tried = ctx.tried()
        return [Proposal(p.spec, self.name, p.kind) for p in self.by.get(ctx.problem.mnk, ()) if p.key not in tried][:k]

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        pass


def tally(store: Any, gpu: str, run: str, plan: Sequence[Planned]) -> tuple[dict, list[dict], list[str]]:
    """Count what the trials store holds for ``run`` against ``plan``: (summary, one row per planned candidate,
    the bars that failed). Bars: every planned candidate stored once, nothing else stored, every good one ``ok``,
    every fault with its expected verdict."""
    rows = store.outcomes(gpu=gpu, run=run)
    by: dict[tuple[str, str], dict] = {}
    dups = 0
    for r in rows:
        k = (r["mnk"], r["key"])
        dups += k in by
        by[k] = r
    per = []
    for p in plan:
        r = by.get((p.problem.mnk, p.key))
        rec = json.loads(r["record"] or "{}") if r else {}
        verdict = r["verdict"] if r else "missing"
        per.append({"index": p.index, "mnk": p.problem.mnk, "round": p.round, "slot": p.slot, "kind": p.kind,
                    "candidate": p.spec.label(), "family": p.spec.family, "layout": p.spec.layout,
                    "expected": p.expected, "verdict": verdict, "as_expected": verdict == p.expected,
                    "reward": "" if not r or r["reward"] is None else r["reward"],
                    "reason": " ".join(str(rec.get("reason") or "").split())[:200], "group": rec.get("group", ""),
                    "worker": r["worker"] if r else "", "gpu_s": r["gpu_s"] if r else "", "ts": r["ts"] if r else ""})
    planned = {(p.problem.mnk, p.key) for p in plan}
    good = [x for x in per if x["kind"] == "good"]
    bad = [x for x in per if x["kind"] != "good"]
    summary = {"run": run, "gpu": gpu, "planned": len(plan), "good": len(good), "faults": len(bad),
               "stored": len(rows), "distinct": len(by), "duplicates": dups,
               "missing": sum(x["verdict"] == "missing" for x in per), "unplanned": len(set(by) - planned),
               "good_ok": sum(x["verdict"] == "ok" for x in good),
               "faults_recorded": sum(x["verdict"] != "missing" for x in bad),
               "faults_as_expected": sum(x["as_expected"] for x in bad)}
    summary.update({f"verdict_{v}": n for v, n in sorted(Counter(x["verdict"] for x in per).items())})
    for kind in sorted({x["kind"] for x in bad}):
        mine = [x for x in bad if x["kind"] == kind]
        summary[f"fault_{kind}"] = f"{sum(x['as_expected'] for x in mine)}/{len(mine)}"
    failed = []
    if summary["stored"] != summary["planned"] or summary["missing"] or summary["unplanned"] or dups:
        failed.append(f"{summary['stored']} outcomes stored for {summary['planned']} planned ({summary['missing']} "
                      f"missing, {summary['unplanned']} unplanned, {dups} duplicates)")
    if summary["good_ok"] != len(good):
        failed.append(f"{len(good) - summary['good_ok']} of {len(good)} good candidates not ok: "
                      + "; ".join(f"{x['candidate']} at {x['mnk']}: {x['verdict']} ({x['reason'][:80]})"
                                  for x in good if x["verdict"] != "ok")[:600])
    if summary["faults_as_expected"] != len(bad):
        failed.append(f"{len(bad) - summary['faults_as_expected']} of {len(bad)} faults not recorded as expected: "
                      + "; ".join(f"{x['candidate']} at {x['mnk']}: {x['verdict']} != {x['expected']}"
                                  for x in bad if not x["as_expected"])[:600])
    return summary, per, failed
