"""Speedup statistics over result rows (DESIGN.md "Speedup").

speedup(c over b) at a shape = t_b / t_c in the device protocols; in ``offline``/``server`` it is the
ratio of mean per-call TFLOPS (CUDA-L2's statistic). Aggregates over shapes: geometric mean (the
headline), arithmetic mean of per-shape ratios (CUDA-L2's headline), median, min, share below 1.0.
Only first-run rows (rep 0, no recheck) that are verified, timed and above the floor count.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping

from .timing import HOST_PROTOCOLS

BASELINES = ("torch", "cublas_tn", "cublas_nn", "cublaslt_heuristic_tn", "cublaslt_heuristic_nn",
             "cublaslt_autotuned_tn", "cublaslt_autotuned_nn")
AGGREGATES = {
    "cublas": ("cublas_tn", "cublas_nn"),
    "cublaslt_heuristic": ("cublaslt_heuristic_tn", "cublaslt_heuristic_nn"),
    "cublaslt_autotuned": ("cublaslt_autotuned_tn", "cublaslt_autotuned_nn"),
    "vendor_best": BASELINES,
}
REFERENCE_COLUMNS = ("torch", "cublas", "cublaslt_heuristic", "cublaslt_autotuned", "vendor_best")


@dataclass(frozen=True)
class Stats:
    n: int
    geomean: float
    amean: float
    median: float
    min: float
    share_below: float

    @staticmethod
    def of(ratios: Iterable[float]) -> "Stats":
        xs = [r for r in ratios if math.isfinite(r) and r > 0]
        if not xs:
            return Stats(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return Stats(len(xs), math.exp(statistics.fmean(math.log(x) for x in xs)), statistics.fmean(xs),
                     statistics.median(xs), min(xs), sum(x < 1.0 for x in xs) / len(xs))


def _f(v: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def usable(r: Mapping[str, str]) -> bool:
    return (r.get("verified") == "true" and r.get("floor_ok", "true") != "false"
            and str(r.get("rep", "0") or "0") == "0" and not r.get("recheck")
            and math.isfinite(_f(r.get("time_ms"))))


def speed(r: Mapping[str, str]) -> float:
    """Higher is faster: TFLOPS (mean of per-call TFLOPS in host protocols; flops/median time otherwise)."""
    return _f(r["tflops"])


def table(rows: Iterable[Mapping[str, str]]) -> dict[tuple, dict[str, Mapping[str, str]]]:
    """{(protocol, dtype, acc, mnk): {candidate: row}} over usable rows."""
    out: dict[tuple, dict[str, Mapping[str, str]]] = {}
    for r in rows:
        if usable(r):
            out.setdefault((r["protocol"], r["dtype"], r["acc"], r["mnk"]), {})[r["candidate"]] = r
    return out


def ratios(rows: Iterable[Mapping[str, str]], cand: str, base: str) -> dict[tuple, float]:
    """Per (protocol, dtype, acc, mnk): speedup of ``cand`` over ``base`` where both were measured."""
    out = {}
    for key, by in table(rows).items():
        if cand in by and base in by and cand != base:
            out[key] = speed(by[cand]) / speed(by[base])
    return out


def best_of(rows: Iterable[Mapping[str, str]], prefix: str) -> dict[tuple[str, str], Mapping[str, str]]:
    """Per (protocol, mnk): the fastest usable row (verified, timed, above the floor, first run) among the
    candidates whose name starts with ``prefix`` (e.g. ``triton:``); aggregate rows are left out. Ties keep
    the first row read. Picking the best of many in one run carries the winner's curse (the maximum of noisy
    measurements is biased upward): an unbiased number re-measures the picked candidate in another run."""
    out: dict[tuple[str, str], Mapping[str, str]] = {}
    for r in rows:
        if not usable(r) or r.get("members") or not str(r.get("candidate", "")).startswith(prefix):
            continue
        key = (r["protocol"], r["mnk"])
        if key not in out or speed(r) > speed(out[key]):
            out[key] = r
    return out


def summarize(rows: list[Mapping[str, str]], candidates: Iterable[str] | None = None,
              bases: Iterable[str] = REFERENCE_COLUMNS) -> list[dict]:
    """One record per (protocol, candidate, baseline) with the aggregate statistics."""
    tab = table(rows)
    protos = sorted({k[0] for k in tab}, key=lambda p: ("graph", "cold", "offline", "server").index(p)
                    if p in ("graph", "cold", "offline", "server") else 9)
    names = list(candidates) if candidates is not None else sorted({c for by in tab.values() for c in by})
    out = []
    for p in protos:
        for c in names:
            for b in bases:
                if b == c:
                    continue
                xs = [speed(by[c]) / speed(by[b]) for k, by in tab.items() if k[0] == p and c in by and b in by]
                if xs:
                    s = Stats.of(xs)
                    out.append({"protocol": p, "candidate": c, "baseline": b, **s.__dict__})
    return out


def format_summary(recs: list[dict]) -> str:
    """A compact text table: one line per (protocol, candidate, baseline)."""
    if not recs:
        return "(no verified, timed rows to summarize)"
    hdr = f"{'protocol':8} {'candidate':24} {'vs':20} {'n':>3} {'geomean':>8} {'amean':>7} {'median':>7} {'min':>6} {'<1.0':>5}"
    lines = [hdr, "-" * len(hdr)]
    for r in recs:
        lines.append(f"{r['protocol']:8} {r['candidate'][:24]:24} {r['baseline'][:20]:20} {r['n']:>3} "
                     f"{r['geomean']:8.3f} {r['amean']:7.3f} {r['median']:7.3f} {r['min']:6.3f} {r['share_below']:5.2f}")
    return "\n".join(lines)


def markdown_summary(recs: list[dict]) -> str:
    if not recs:
        return "_no verified, timed rows_\n"
    lines = ["| protocol | candidate | vs | shapes | geomean | arith. mean | median | min | share < 1.0 |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in recs:
        lines.append(f"| {r['protocol']} | {r['candidate']} | {r['baseline']} | {r['n']} | {r['geomean']:.3f} | "
                     f"{r['amean']:.3f} | {r['median']:.3f} | {r['min']:.3f} | {r['share_below']:.2f} |")
    return "\n".join(lines) + "\n"


def is_host(protocol: str) -> bool:
    return protocol in HOST_PROTOCOLS


@dataclass(frozen=True)
class Spread:
    """Repeatability: |t_rep / t_rep0 - 1| of the same (shape, candidate) measured in several reps."""

    n: int
    median: float
    p90: float
    max: float
    worst: tuple[str, str] | None  # (mnk, candidate)


def repeat_spread(rows: Iterable[Mapping[str, str]], protocol: str = "graph") -> Spread:
    """Spread between reps (``--repeat``) of verified, timed, first-run (no recheck) member rows; the
    relative difference of each rep > 0 to rep 0, taken on time_ms."""
    by: dict[tuple[str, str], dict[str, float]] = {}
    for r in rows:
        if (r.get("protocol") != protocol or r.get("verified") != "true" or r.get("recheck")
                or r.get("members") or not math.isfinite(_f(r.get("time_ms")))):
            continue
        by.setdefault((r["mnk"], r["candidate"]), {})[str(r.get("rep", "0") or "0")] = _f(r["time_ms"])
    diffs = [(abs(t / reps["0"] - 1.0), key) for key, reps in by.items() if "0" in reps
             for rep, t in reps.items() if rep != "0"]
    if not diffs:
        return Spread(0, math.nan, math.nan, math.nan, None)
    xs = sorted(d for d, _ in diffs)
    k = max(range(len(diffs)), key=lambda i: diffs[i][0])
    return Spread(len(xs), statistics.median(xs), xs[min(len(xs) - 1, math.ceil(0.9 * len(xs)) - 1)], xs[-1],
                  diffs[k][1])
