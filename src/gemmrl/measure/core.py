"""The measuring unit that `gemmrl bench` (bench) and the sandboxed evaluation of a candidate (evaluate) both call:
candidates verified with the battery, then timed side by side with the vendor paths, interleaved on identical
inputs, in one protocol; rows in the results schema.

- :class:`Verifier` runs the battery once per (candidate, problem, algorithm) and remembers the verdict;
- :func:`vendor_baselines` the vendor paths a measurement is restricted to;
- :func:`base_row` the columns every row of one (problem, protocol, repetition) shares;
- :func:`measure_problem` one problem in one protocol: every candidate prepared (cuBLASLt autotuning selects its
  algorithm in the protocol it is then measured in), verified (an unverified candidate is reported with its reason
  and not timed), the verified ones timed interleaved, times under the roofline floor flagged, the aggregate rows
  added, pairs that break the noise rule's bar re-measured (``recheck`` rows), and ours against vendor_best's member
  re-measured at every shape (the pair's figure from a run other than the one that chose that member);
- :func:`aggregate_rows` the aggregates (cublas, cublaslt_heuristic, cublaslt_autotuned, vendor_best), each the
  fastest verified of its members.

The noise rule's verdict on a results CSV (``noise_rule_below``) is bench's.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any, Callable

from ..kernels import vendor  # vendor.vendor_candidates looked up at call time: tests replace it
from ..problem import GemmProblem
from ..results import now, sm_clock_mhz
from ..summary import AGGREGATES, BASELINES
from ..timing import TimingConfig, below_floor, make_timer, measure
from ..verify import verify

# (slower-suspect, reference) aggregates: re-measured 3 more times when the first is slower (noise rule).
# ``gemmrl`` (what the dispatcher serves) is re-measured when more than RECHECK_MARGIN slower than vendor_best: the
# serving bar is "never slower by more than 2%" (noise rule).
RECHECK_PAIRS = (("cublaslt_autotuned", "cublaslt_heuristic"), ("gemmrl", "vendor_best"))
RECHECK_MARGIN = {("gemmrl", "vendor_best"): 0.02}
RECHECKS = 3
# Pairs re-measured head to head: only the member of each side that the first run compared (gemmrl, and the vendor
# path that was vendor_best), interleaved, instead of every member of both sides. In the host-timed protocols the
# crowd favours whichever call path fills most of its slots: on an H100 (h100_offline-host-probe-crowd-variants_
# 2567be1_2026-11-24.csv) the same cuBLASLt plan through gemmrl.mm ran 0.6-1.0 us slower than through the bench's
# ctypes call when 6 of 8 slots were ctypes calls, 2.9-3.3 us faster when 6 of 8 were gemmrl calls, and 0.9-1.1 us
# faster head to head. The winner chosen in the first run is re-measured, not re-chosen (DESIGN: no winner's curse).
RECHECK_HEAD_TO_HEAD = frozenset({("gemmrl", "vendor_best")})
# Pairs re-measured at every shape, not only where the first is slower: vendor_best is the fastest of up to seven
# first-run measurements (a winner chosen on that run), so its first-run time sits low by the noise of the paths that
# tie it (several often run one kernel). Its chosen member re-measured head to head with ours gives the pair's ratio
# from runs other than the one that chose it (DESIGN: a winner is chosen on one run and reported from another);
# ``bench.second_run`` reads them, and the noise rule's verdict uses the same re-measurements.
RECHECK_EVERY = frozenset({("gemmrl", "vendor_best")})


class Verifier:
    """Runs the battery once per (candidate, algorithm) and remembers the verdict."""

    def __init__(self, device: str):
        self.device = device
        self.cache: dict[tuple, tuple[bool, str]] = {}

    def __call__(self, cand, problem: GemmProblem) -> tuple[bool, str]:
        key = (cand.name, problem, str(cand.info().get("algo", "")))
        if key not in self.cache:
            try:
                v = verify(cand, problem, self.device)
                self.cache[key] = (bool(v.passed), v.reason)
            except Exception as e:  # noqa: BLE001 - a crashing candidate is unverified, not fatal
                self.cache[key] = (False, f"verification raised {type(e).__name__}: {e}"[:300])
        return self.cache[key]


def vendor_baselines(problem: GemmProblem, baselines: tuple[str, ...] | None = None) -> list:
    """The vendor paths for ``problem`` (kernels/vendor.py), only those named in ``baselines`` unless it is None."""
    return [v for v in vendor.vendor_candidates(problem) if baselines is None or v.name in baselines]


def base_row(problem: GemmProblem, protocol: str, meta_row: dict, rep: int, cfg: TimingConfig) -> dict:
    """The columns every row of ``problem`` in ``protocol`` (repetition ``rep``) shares: the shape, the protocol's
    timing settings (host protocols only) and ``meta_row`` (the machine, results.Meta.row)."""
    host = protocol in ("offline", "server")
    return {"mnk": problem.mnk, "M": problem.M, "N": problem.N, "K": problem.K, "dtype": problem.dtype,
            "acc": problem.acc, "protocol": protocol, "rep": rep,
            "qps": cfg.qps if protocol == "server" else None,
            "warmup_s": cfg.warmup_s if host else None, "benchmark_s": cfg.benchmark_s if host else None,
            **meta_row}


def aggregate_rows(rows: list[dict], baselines: tuple[str, ...] | None = None, acc: str = "fp32") -> list[dict]:
    """The aggregates (cublas, cublaslt_heuristic, cublaslt_autotuned, vendor_best): each the fastest verified of
    its members. With ``baselines`` (the vendor paths a run was restricted to), an aggregate with a member left out
    is not written (torch does not apply to acc fp16)."""
    ok = {r["candidate"]: r for r in rows if r.get("verified") and r.get("floor_ok", True)
          and math.isfinite(r.get("time_ms", math.inf)) and not r.get("recheck")}
    out = []
    for agg, members in AGGREGATES.items():
        if baselines is not None and any(m not in baselines and not (m == "torch" and acc == "fp16") for m in members):
            continue
        have = [ok[m] for m in members if m in ok]
        if not have:
            continue
        best = max(have, key=lambda r: r["tflops"])
        out.append({**best, "candidate": agg, "members": best["candidate"]})
    return out


def timing_fields(t) -> dict:
    """The timing columns of a row from a ``timing.Timing``."""
    return {"time_ms": t.time_ms, "tflops": t.tflops, "n": t.n, "p20_ms": t.p20_ms, "p80_ms": t.p80_ms}


def measure_problem(problem: GemmProblem, protocol: str, cands: list, bufs, cfg: TimingConfig,
                    verifier: Callable, floor: float, base: dict, baselines: tuple[str, ...] | None = None) -> list[dict]:
    """Rows of ``cands`` at ``problem`` in ``protocol`` on the inputs ``bufs``: each prepared and checked with
    ``verifier(cand, problem) -> (ok, reason)``, the verified ones timed interleaved (in offline/server ours, every
    candidate not in summary.BASELINES, in one loop per vendor path: timing.time_host_pairs), then the aggregate rows
    (restricted as in :func:`aggregate_rows`) and the noise rule's re-measurements. ``base`` (from :func:`base_row`,
    with ``sm_clock_mhz`` before the run) starts every row; ``floor`` is the roofline floor in ms (nan: none)."""
    timer = make_timer(bufs, protocol, cfg)
    rows: list[dict] = []
    live: dict[str, Any] = {}
    setup: dict[str, str] = {}   # candidate -> where its time outside the timed calls went (row info)
    for cand in cands:
        row = {**base, "candidate": cand.name, "layout": cand.layout}
        t0 = time.perf_counter()
        try:
            cand.prepare(problem, bufs, protocol, timer)
        except Exception as e:  # noqa: BLE001
            rows.append({**row, "verified": False, "reason": f"prepare failed: {type(e).__name__}: {e}"[:300]})
            continue
        info = cand.info()
        row.update(algo=info.get("algo", ""), n_algos=info.get("n_algos", ""), layout=cand.layout)
        t1 = time.perf_counter()
        ok, reason = verifier(cand, problem)
        # prepare (build, plan, autotune) and the battery (once per candidate and shape: ~0 in the next protocol)
        setup[cand.name] = f"prep_ms={(t1 - t0) * 1e3:.0f};verify_ms={(time.perf_counter() - t1) * 1e3:.0f}"
        if not ok:
            rows.append({**row, "verified": False, "reason": reason or "failed verification"})
            continue
        a, b, bt, c = bufs.args()
        live[cand.name] = (row, (lambda f=cand: f(a, b, bt, c)))
    # ours (every candidate that is not a vendor path) against each vendor path in a loop of its own in offline/server
    times = measure({k: v[1] for k, v in live.items()}, bufs, protocol, cfg, layouts=_layouts(cands, live),
                    ours=[k for k in live if k not in BASELINES])
    clk = sm_clock_mhz(bufs.a.device.index or 0) if bufs.a.is_cuda else ""
    for name, (row, _) in live.items():
        t = times[name]
        if t.extra.get("output_wrong"):  # its timed calls did not compute their answer: rejected, not slow
            rows.append({**row, "verified": False, "reason": t.reason, "info": f"timing_seed={t.extra.get('seed')}",
                         "timestamp": now()})
            continue
        r = {**row, **timing_fields(t), "verified": True, "reason": t.reason, "floor_ms": floor,
             "floor_ok": not below_floor(t.time_ms, floor), "sm_clock_mhz": f"{base['sm_clock_mhz']}/{clk}",
             "timestamp": now()}
        if protocol == "graph":
            r["info"] = f"calls_per_graph={t.extra.get('calls_per_graph', '')}"
            if cfg.graph_min_timed_ms != TimingConfig.graph_min_timed_ms:  # a shorter statistic (bench --timing quick)
                r["info"] += f";min_timed_ms={cfg.graph_min_timed_ms:g}"
        if protocol in ("graph", "cold") and "settle_ms" in t.extra:
            r["info"] = ";".join(x for x in (r.get("info", ""), f"settle_ms={t.extra['settle_ms']}",
                                             f"settle_mhz={t.extra.get('settle_mhz') or ''}") if x)
        if t.extra.get("late_retaken"):   # samples whose start event fired before the work was enqueued
            r["info"] = ";".join(x for x in (r.get("info", ""), f"late_retaken={t.extra['late_retaken']}",
                                             f"late_kept={t.extra.get('late_kept', 0)}") if x)
        r["info"] = ";".join(x for x in (r.get("info", ""), _fresh_info(t), setup[name]) if x)
        if not r["floor_ok"]:
            r["reason"] = f"below the roofline floor ({t.time_ms:.4g} ms < 0.95 x {floor:.4g} ms): measurement error"
        rows.append(r)
    rows += aggregate_rows(rows, baselines, problem.acc)
    rows += _recheck(rows, live, bufs, protocol, cfg)
    for r in rows:
        r.setdefault("timestamp", now())
        r.setdefault("sm_clock_mhz", f"{base['sm_clock_mhz']}/{clk}")
    return rows


def _layouts(cands: list, live: dict) -> dict[str, str]:
    """{name: layout} of the timed candidates: the graph protocol refills the form of B each one reads."""
    return {c.name: c.layout for c in cands if c.name in live}


def _fresh_info(t) -> str:
    """Row info on the inputs and outputs of the timed calls: the timing seed, how many outputs were checked, the
    per-call refill time subtracted in graph (or fresh_inputs=0 where a measurement of that cost turned it off); in
    offline/server the loop (host_loop=pairs: one loop per baseline, all: one loop of every candidate), for ours
    under pairs the baseline whose loop gave its time (paired_with=), and the CPU a pinned loop ran on (pinned_cpu=)."""
    e = t.extra
    parts = [f"timing_seed={e['seed']}"] if "seed" in e else []
    if "output_checks" in e:
        parts.append(f"output_checks={e['output_checks']}")
    if "fill_ms" in e:
        parts.append(f"fill_us={e['fill_ms'] * 1e3:.2f}")
    if "fresh_inputs" in e:
        parts.append(f"fresh_inputs={e['fresh_inputs']}")
    parts += [f"{k}={e[k]}" for k in ("host_loop", "paired_with", "pinned_cpu") if k in e]
    return ";".join(parts)


def _recheck(rows: list[dict], live: dict, bufs, protocol: str, cfg: TimingConfig) -> list[dict]:
    """Noise rule: where aggregate ``x`` is slower than aggregate ``ref`` in the first measurement (a RECHECK_EVERY
    pair: at every shape), all their members (for a RECHECK_HEAD_TO_HEAD pair: the member each side won with) are
    re-measured RECHECKS more times, interleaved; rows carry ``recheck`` = 1..RECHECKS."""
    by = {r["candidate"]: r for r in rows if r.get("verified") and not r.get("members")}
    agg = {r["candidate"]: r for r in rows if r.get("members")}
    out = []
    agg = {**{k: v for k, v in by.items() if k not in AGGREGATES}, **agg}
    for x, ref in RECHECK_PAIRS:
        margin = RECHECK_MARGIN.get((x, ref), 0.0)
        if x not in agg or ref not in agg:
            continue
        if (x, ref) not in RECHECK_EVERY and agg[x]["tflops"] >= agg[ref]["tflops"] * (1 - margin):
            continue
        if (x, ref) in RECHECK_HEAD_TO_HEAD:
            sides = ((agg[x].get("members") or x,), (agg[ref].get("members") or ref,))
        else:
            sides = (AGGREGATES.get(x, (x,)), AGGREGATES.get(ref, (ref,)))
        names = [m for m in (*sides[0], *sides[1]) if m in by and m in live]
        for k in range(1, RECHECKS + 1):
            # host protocols re-measure with the sweep durations (at most 0.25 s + 1 s), recorded in the rows
            cfg_k = replace(cfg, seed=None if cfg.seed is None else cfg.seed + 100 * k, warmup_s=min(cfg.warmup_s, 0.25),
                            benchmark_s=min(cfg.benchmark_s, 1.0))
            ts = measure({m: live[m][1] for m in names}, bufs, protocol, cfg_k,
                         layouts={m: by[m].get("layout", "") for m in names},
                         ours=[m for m in names if m not in BASELINES])
            host = protocol in ("offline", "server")
            for m in names:
                if ts[m].extra.get("output_wrong"):
                    out.append({**by[m], "verified": False, "reason": ts[m].reason, "recheck": k, "timestamp": now(),
                                "time_ms": math.inf, "tflops": 0.0})
                    continue
                out.append({**by[m], **timing_fields(ts[m]), "recheck": k, "timestamp": now(),
                            "warmup_s": cfg_k.warmup_s if host else None,
                            "benchmark_s": cfg_k.benchmark_s if host else None})
    return out
