"""False-rejection sweep: how often the correctness battery (verify.py) rejects correct kernels.

For every problem and every candidate a factory gives for it (the vendor paths, configs of our families that
their validity predicates accept there), over many seeds:

* the full battery, ``verify.verify(cand, problem, seeds=[s])``, for the first ``full_battery_seeds`` seeds
  (it includes ``stream_order``, whose device sleep costs 20+ ms a run);
* then for every seed one accuracy call and one exact-integer call through the battery's own harness
  (``verify._call``: NaN pre-fill, guard bands, inputs unchanged, stream and tamper checks on every call),
  judged by the battery's own criteria: ``verify._measure`` + ``verify._judge`` against the fp64 reference
  (R and the element-wise bound of ``verify.Tolerance``), and a bitwise-exact match of the integer product.

Work is shared across candidates: each is prepared once per problem and keeps one guarded harness for all
seeds; per seed the random-normal inputs, their fp64 reference and the exact integer product are computed once
for all candidates. A correct kernel that fails any of these is a false rejection; the issue's target is 0.
A candidate whose ``prepare`` fails is reported as not run (``status='not_run'``), never as a rejection.

Run on a GPU: ``python benchmarks/acceptance/false_rejections.py --out DIR`` (rows and summary CSVs, a table last).
Tests: ``pytest tests/adversarial/test_false_rejections.py`` (interpreter tier: planted and Triton-family kernels on CPU tensors).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from functools import partial
from typing import Any, Iterable, Sequence

from .. import verify as V
from ..candidate import Buffers, torch_dtype
from ..problem import GemmProblem
from ..timing import TimingConfig, measure

ROW_FIELDS = ("mnk", "dtype", "acc", "layout", "candidate", "family", "status", "seeds", "battery_runs", "trials",
              "failures", "first_fail_seed", "first_fail_check", "reason", "r_max", "r_limit", "r_over_limit_max",
              "elem_ratio_max", "beta_needed_max", "seconds")


def family_of(cand) -> str:
    """'vendor', 'triton', 'cutlass', 'planted', ... from the candidate's module (no imports needed)."""
    fam = getattr(cand, "family", "")
    if isinstance(fam, str) and fam:
        return fam
    mod = type(cand).__module__
    for key, name in (("vendor", "vendor"), ("triton_gemm", "triton"), ("cutlass", "cutlass"), ("tiny_gemm", "tiny"),
                      ("wgmma_gemm", "wgmma"), ("planted", "planted")):
        if key in mod:
            return name
    return mod.rsplit(".", 1)[-1]


class _Counted:
    """Forwards calls (and their return value, which the harness inspects) and attributes to a candidate, counting
    the calls: the battery sees the candidate's own behaviour."""

    def __init__(self, cand):
        self.cand, self.calls = cand, 0

    def __call__(self, a, b, bt, c):
        self.calls += 1
        return self.cand(a, b, bt, c)

    def __getattr__(self, name: str):
        return getattr(self.__dict__["cand"], name)


class _Track:
    """One candidate's state over a problem's seeds: its harness, counts, worst statistics, first failure."""

    def __init__(self, cand, problem: GemmProblem, tol: V.Tolerance, error: str):
        self.cand, self.counted, self.problem, self.tol = cand, _Counted(cand), problem, tol
        self.error, self.g = error, None
        self.battery = self.failures = 0
        self.first_seed: int | str = ""
        self.first_check = self.reason = ""
        self.r_max = self.elem_max = self.beta_max = -math.inf
        self.seconds = 0.0

    def guard(self, device, seed: int) -> V._Guarded:
        if self.g is None:
            self.g = V._Guarded(self.problem, device, seed)
        return self.g

    def fail(self, seed: int, check: str, reason: str) -> None:
        self.failures += 1
        if not self.reason:
            self.first_seed, self.first_check, self.reason = seed, check, reason
        self.g = None  # a failed call may have left the harness dirty (bands, inputs): a fresh one next time

    def measured(self, m) -> None:
        self.r_max = max(self.r_max, m["r"])
        self.elem_max = max(self.elem_max, m["elem_ratio"])
        self.beta_max = max(self.beta_max, m["beta_needed"])

    def row(self, n_seeds: int) -> dict[str, Any]:
        p, c = self.problem, self.cand
        ran = not self.error
        fin = (lambda x: x if math.isfinite(x) else math.nan)  # noqa: E731 - nothing measured: NaN, not -inf
        r_limit = self.tol.r_limit(p.K)
        return {"mnk": p.mnk, "dtype": p.dtype, "acc": p.acc, "layout": getattr(c, "layout", ""),
                "candidate": getattr(c, "name", repr(c)), "family": family_of(c),
                "status": "not_run" if not ran else ("rejected" if self.failures else "passed"),
                "seeds": n_seeds if ran else 0, "battery_runs": self.battery, "trials": self.counted.calls,
                "failures": self.failures, "first_fail_seed": self.first_seed, "first_fail_check": self.first_check,
                "reason": self.error or self.reason, "r_max": fin(self.r_max), "r_limit": r_limit,
                "r_over_limit_max": fin(self.r_max) / r_limit, "elem_ratio_max": fin(self.elem_max),
                "beta_needed_max": fin(self.beta_max), "seconds": round(self.seconds, 4)}


def _exact_int_failure(c, ref, problem: GemmProblem, seed: int) -> str:
    """'' if C equals the exact integer product bit for bit (as values), else check_exact_int's reason."""
    try:
        V._exact_mismatch(c, ref, problem, seed)
    except V._Fail as f:
        return f.result.reason
    return ""


def _accuracy_failure(c, ref, problem: GemmProblem, tol: V.Tolerance, seed: int, track: "_Track") -> str:
    """'' if C passes the accuracy check's criteria (``verify._judge``), else its reason; records R and friends."""
    m = V._measure(c, ref, problem, tol)
    track.measured(m)
    try:
        V._judge(m, problem, tol, f"seed {seed}")
    except V._Fail as f:
        return f.result.reason
    return ""


def _trial(t: "_Track", dev, seed: int, check: str, judge, a, b) -> None:
    """One guarded call of ``t``'s candidate on inputs ``a``, ``b`` in its harness, judged; failures recorded."""
    g = t.guard(dev, seed)
    g.load(a, b)
    try:
        why = judge(V._call(t.counted, g, f"{check} seed {seed}"))
        if why:
            t.fail(seed, check, why)
    except V._Fail as f:
        t.fail(seed, f.result.name, f.result.reason)
    except Exception as e:  # noqa: BLE001 - the harness itself broke (a sticky CUDA error): a failure, reported
        t.fail(seed, "harness", f"harness: {type(e).__name__}: {e} (during {check} seed {seed})")


def _bar(progress, total: int):
    if progress is True:
        try:
            from tqdm.auto import tqdm  # optional dependency: progress bars where installed

            return tqdm(total=total, desc="false rejections", unit="seed", dynamic_ncols=True), True
        except ImportError:
            return None, False
    return (progress or None), False


def false_rejection_rows(problems: Iterable[GemmProblem], candidates, seeds: Sequence[int], device="cuda",
                         full_battery_seeds: int = 1, progress=False, *, timer=None,
                         tolerance: V.Tolerance | None = None) -> list[dict]:
    """One row per (problem, candidate) (``ROW_FIELDS``): calls made, failures, the first failing seed and
    reason, the worst R, R/limit, element ratio and needed beta, and the candidate's seconds.

    ``candidates``: a list, or ``problem -> list`` so that each shape gets configs valid there; each candidate
    is prepared once per problem (protocol 'graph', ``timer`` as in ``verify.calibrate``). ``progress``: True
    for a tqdm bar over (problem, seed) steps, or an object with ``update(n)`` (a bar of the caller's)."""
    torch = V._torch()
    dev = V._device(device)
    seeds = list(seeds)
    problems = list(problems)
    bar, own = _bar(progress, len(problems) * len(seeds))
    rows: list[dict] = []
    try:
        with torch.no_grad():
            for p in problems:
                rows += _problem_rows(p, candidates, seeds, dev, full_battery_seeds, bar, timer,
                                      tolerance or V.tolerance_for(p))
    finally:
        if own and bar is not None:
            bar.close()
    return rows


def _buffers(p: GemmProblem, dev) -> Buffers:
    """``candidate.make_buffers`` drawn with the device's generator (the CPU's takes ~0.3 s at 4096^3)."""
    torch = V._torch()
    a, b = V._normal_inputs(p, dev, 0)
    c = torch.full((p.M, p.N), float("nan"), dtype=torch_dtype(p.dtype), device=dev)
    return Buffers(p, a, b, b.t().contiguous(), c)


def _problem_rows(p: GemmProblem, candidates, seeds: list[int], dev, full_battery_seeds: int, bar, timer,
                  tol: V.Tolerance) -> list[dict]:
    cands = V._candidates_for(candidates, p)
    bufs = _buffers(p, dev)
    tracks = []
    for cand in cands:
        t0 = time.perf_counter()
        err = V._prepare(cand, p, bufs, timer)
        tracks.append(_Track(cand, p, tol, err))
        tracks[-1].seconds += time.perf_counter() - t0
    del bufs
    live = [t for t in tracks if not t.error]
    for s in seeds[:max(0, full_battery_seeds)]:
        for t in live:
            t0 = time.perf_counter()
            try:
                v = V.verify(t.counted, p, dev, seeds=[s], tolerance=tol)
            except Exception as e:  # noqa: BLE001 - the harness itself broke (a sticky CUDA error): a failure
                t.fail(s, "battery/harness", f"harness: {type(e).__name__}: {e}")
            else:
                if v.passed and "r" in v.stats:
                    t.r_max = max(t.r_max, v.stats["r"])
                    t.elem_max = max(t.elem_max, v.stats["elem_ratio"])
                elif not v.passed:
                    t.fail(s, f"battery/{v.failed_check}", v.reason)
            t.battery += 1
            t.seconds += time.perf_counter() - t0
    for s in seeds:
        a, b = V._normal_inputs(p, dev, s)
        ref = V._reference(a, b, p.dtype)
        ai, bi = V._int_inputs(p, dev, s)
        iref = ai.double() @ bi.double()
        for t in live:
            t0 = time.perf_counter()
            judge = partial(_accuracy_failure, ref=ref, problem=p, tol=tol, seed=s, track=t)
            _trial(t, dev, s, "accuracy", judge, a, b)
            _trial(t, dev, s, "exact_int", partial(_exact_int_failure, ref=iref, problem=p, seed=s), ai, bi)
            t.seconds += time.perf_counter() - t0
        del ref, iref
        if bar is not None:
            bar.update(1)
    for t in tracks:
        t.g = None
    return [t.row(len(seeds)) for t in tracks]


TIMED_FIELDS = ("mnk", "dtype", "acc", "layout", "candidate", "family", "protocol", "status", "seeds", "output_checks",
                "failures", "first_fail_seed", "reason", "seconds")
TIMED_PROTOCOLS = ("graph", "cold", "offline")
# the timed-output check under each protocol's own input refresh, with statistics cut to the minimum: what is counted
# is whether C after timed calls matches the recompute, not the times
SWEEP_TIMING = TimingConfig(graph_min_work_ms=0.3, graph_replays=3, graph_min_timed_ms=0.0, settle_ms=0.0,
                            settle_max_ms=0.0, cold_calls=4, warmup_s=0.0, benchmark_s=0.02, output_checks=3)


def timed_output_rows(problems: Iterable[GemmProblem], candidates, seeds: Sequence[int], device="cuda",
                      protocols: Sequence[str] = TIMED_PROTOCOLS, progress=False,
                      timing: TimingConfig = SWEEP_TIMING) -> list[dict]:
    """False rejections of the timed-output check (outputs.py): every candidate (correct, as in
    :func:`false_rejection_rows`) timed in each protocol once per seed (the seed is the timing seed: inputs, checked
    rows and columns), ``timing.output_checks`` checked calls each; one row per (problem, candidate, protocol)
    (``TIMED_FIELDS``). ``device`` 'cpu' runs the host protocols only (graph and cold need CUDA)."""
    torch = V._torch()
    dev = V._device(device)
    seeds, problems = list(seeds), list(problems)
    protocols = [p for p in protocols if dev.type == "cuda" or p in ("offline", "server")]
    bar, own = _bar(progress, len(problems) * len(seeds))
    rows: list[dict] = []
    try:
        with torch.no_grad():
            for p in problems:
                rows += _timed_problem_rows(p, candidates, seeds, dev, protocols, timing, bar)
    finally:
        if own and bar is not None:
            bar.close()
    return rows


def _timed_problem_rows(p: GemmProblem, candidates, seeds: list[int], dev, protocols, timing: TimingConfig,
                        bar) -> list[dict]:
    cands = V._candidates_for(candidates, p)
    bufs = _buffers(p, dev)
    out: dict[tuple[str, str], dict] = {}
    live = {}
    for cand in cands:
        err = V._prepare(cand, p, bufs, None)
        for proto in protocols:
            out[(cand.name, proto)] = {"mnk": p.mnk, "dtype": p.dtype, "acc": p.acc, "layout": cand.layout,
                                       "candidate": cand.name, "family": family_of(cand), "protocol": proto,
                                       "status": "not_run" if err else "passed", "seeds": 0, "output_checks": 0,
                                       "failures": 0, "first_fail_seed": "", "reason": err, "seconds": 0.0}
        if not err:
            a, b, bt, c = bufs.args()
            live[cand.name] = (cand, lambda f=cand: f(a, b, bt, c))
    layouts = {k: v[0].layout for k, v in live.items()}
    for s in seeds:
        for proto in protocols:
            t0 = time.perf_counter()
            got = measure({k: v[1] for k, v in live.items()}, bufs, proto, replace(timing, seed=s), layouts=layouts)
            dt = (time.perf_counter() - t0) / max(1, len(live))
            for name, t in got.items():
                r = out[(name, proto)]
                r["seeds"] += 1
                r["seconds"] = round(r["seconds"] + dt, 3)
                r["output_checks"] += int(t.extra.get("output_checks", 0))
                if t.extra.get("output_wrong") or not t.ok:
                    r["failures"] += 1
                    if r["status"] != "rejected":
                        r.update(status="rejected", first_fail_seed=s, reason=t.reason[:300])
        if bar is not None:
            bar.update(1)
    del bufs
    return list(out.values())


def summary(rows: Iterable[dict]) -> list[dict]:
    """Per family, then 'all': candidates run and not run, shapes, calls, false rejections (failing calls or
    battery runs of correct kernels), candidates with any, and the worst R/limit and element ratio."""
    groups: dict[str, dict] = {}
    shapes: dict[str, set] = {}
    for r in rows:
        for fam in (r["family"], "all"):
            g = groups.setdefault(fam, {"family": fam, "candidates": 0, "not_run": 0, "shapes": 0, "calls": 0,
                                        "battery_runs": 0, "false_rejections": 0, "rejected_candidates": 0,
                                        "r_over_limit_max": 0.0, "elem_ratio_max": 0.0, "seconds": 0.0})
            g["seconds"] += float(r["seconds"])
            if r["status"] == "not_run":
                g["not_run"] += 1
                continue
            shapes.setdefault(fam, set()).add((r["mnk"], r["dtype"], r["acc"]))
            g["candidates"] += 1
            g["calls"] += int(r["trials"])
            g["battery_runs"] += int(r["battery_runs"])
            g["false_rejections"] += int(r["failures"])
            g["rejected_candidates"] += int(r["failures"] > 0)
            for k in ("r_over_limit_max", "elem_ratio_max"):
                if isinstance(r[k], (int, float)) and math.isfinite(r[k]):
                    g[k] = max(g[k], float(r[k]))
    for fam, g in groups.items():
        g["shapes"] = len(shapes.get(fam, ()))
        g["seconds"] = round(g["seconds"], 2)
    order = sorted((f for f in groups if f != "all")) + (["all"] if "all" in groups else [])
    return [groups[f] for f in order]
