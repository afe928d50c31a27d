"""measure/core.py on the CPU: the aggregate rows, the base row's columns, the timing columns, the verifier's cache,
the vendor paths a measurement is restricted to, and one problem measured (host protocol, CPU tensors)."""

from __future__ import annotations

import dataclasses
import math
import os

import pytest

from gemmrl.candidate import FnCandidate, make_buffers
from gemmrl.measure import core
from gemmrl.problem import GemmProblem
from gemmrl.summary import AGGREGATES
from gemmrl.timing import Timing, TimingConfig

FAST = TimingConfig(warmup_s=0.0, benchmark_s=0.02)


def _mm(a, b, bt, c):
    c.copy_((a.float() @ b.float()).to(c.dtype))


def _row(name, tflops, **kw):
    return {"candidate": name, "verified": True, "time_ms": 1.0 / tflops, "tflops": tflops, **kw}


def test_aggregate_rows_are_the_fastest_usable_member_in_aggregates_order():
    rows = [_row("cublas_tn", 1.0), _row("cublas_nn", 3.0, recheck=1),       # a recheck row never wins
            _row("cublaslt_heuristic_tn", 2.0), _row("cublaslt_heuristic_nn", 9.0, floor_ok=False),
            {"candidate": "torch", "verified": False, "time_ms": math.inf, "tflops": 0.0},
            _row("cublaslt_autotuned_tn", 5.0, time_ms=math.inf),           # not finite: not timed
            _row("cublaslt_autotuned_nn", 4.0, algo="7")]
    got = core.aggregate_rows(rows)
    assert [r["candidate"] for r in got] == list(AGGREGATES)
    by = {r["candidate"]: r for r in got}
    assert by["cublas"]["members"] == "cublas_tn"
    assert by["cublaslt_heuristic"]["members"] == "cublaslt_heuristic_tn"
    assert by["cublaslt_autotuned"]["members"] == "cublaslt_autotuned_nn"
    assert by["vendor_best"]["members"] == "cublaslt_autotuned_nn"
    # the aggregate row is a copy of its member's row under the aggregate's name
    assert by["vendor_best"]["tflops"] == 4.0 and by["vendor_best"]["algo"] == "7"
    assert rows[-1]["candidate"] == "cublaslt_autotuned_nn" and "members" not in rows[-1]


def test_aggregate_rows_leave_out_an_aggregate_missing_a_member():
    rows = [_row("cublas_tn", 1.0), _row("cublas_nn", 2.0)]
    assert {r["candidate"] for r in core.aggregate_rows(rows)} == {"cublas", "vendor_best"}
    only = core.aggregate_rows(rows, baselines=("cublas_tn", "cublas_nn"))
    assert [(r["candidate"], r["members"]) for r in only] == [("cublas", "cublas_nn")]
    assert core.aggregate_rows([{"candidate": "cublas_tn", "verified": False}]) == []


def test_base_row_columns_per_protocol():
    p = GemmProblem(16, 24, 40)
    cfg = TimingConfig(warmup_s=0.5, benchmark_s=2.0, qps=50.0)
    meta = {"gpu": "cpu", "git_sha": "abc"}
    server = core.base_row(p, "server", meta, 2, cfg)
    assert list(server) == ["mnk", "M", "N", "K", "dtype", "acc", "protocol", "rep", "qps", "warmup_s",
                            "benchmark_s", "gpu", "git_sha"]
    assert (server["mnk"], server["M"], server["N"], server["K"]) == ("16_24_40", 16, 24, 40)
    assert (server["dtype"], server["acc"], server["protocol"], server["rep"]) == (p.dtype, p.acc, "server", 2)
    assert (server["qps"], server["warmup_s"], server["benchmark_s"]) == (50.0, 0.5, 2.0)
    offline = core.base_row(p, "offline", meta, 0, cfg)
    assert (offline["qps"], offline["warmup_s"], offline["benchmark_s"]) == (None, 0.5, 2.0)
    graph = core.base_row(p, "graph", meta, 0, cfg)
    assert list(graph) == list(server)
    assert (graph["qps"], graph["warmup_s"], graph["benchmark_s"]) == (None, None, None)


def test_timing_fields():
    t = Timing("offline", 2.0, 3.0, 7, 1.5, 2.5, reason="x", extra={"settle_ms": 1})
    assert core.timing_fields(t) == {"time_ms": 2.0, "tflops": 3.0, "n": 7, "p20_ms": 1.5, "p80_ms": 2.5}
    assert list(core.timing_fields(t)) == ["time_ms", "tflops", "n", "p20_ms", "p80_ms"]


def test_verifier_runs_the_battery_once_per_candidate_problem_and_algorithm(monkeypatch):
    calls = []

    class Verdict:
        def __init__(self, passed, reason):
            self.passed, self.reason = passed, reason

    def fake_verify(cand, problem, device):
        calls.append((cand.name, problem.mnk, device))
        if cand.name == "crash":
            raise RuntimeError("boom")
        return Verdict(cand.name == "good", "" if cand.name == "good" else "wrong")

    monkeypatch.setattr(core, "verify", fake_verify)
    v = core.Verifier("cpu")
    good, p, q = FnCandidate("good", "nn", _mm), GemmProblem(8, 8, 8), GemmProblem(8, 8, 16)
    assert v(good, p) == (True, "") and v(good, p) == (True, "")
    assert calls == [("good", "8_8_8", "cpu")]
    assert v(good, q) == (True, "") and len(calls) == 2
    assert v(FnCandidate("good", "nn", _mm, extra={"algo": 3}), p) == (True, "") and len(calls) == 3
    assert v(FnCandidate("bad", "nn", _mm), p) == (False, "wrong")
    assert v(FnCandidate("crash", "nn", _mm), p) == (False, "verification raised RuntimeError: boom")


def test_vendor_baselines_filters_by_name(monkeypatch):
    from gemmrl.kernels import vendor

    monkeypatch.setattr(vendor, "vendor_candidates",
                        lambda problem: [FnCandidate(n, "tn", _mm) for n in ("torch", "cublas_tn", "cublas_nn")])
    p = GemmProblem(8, 8, 8)
    assert [c.name for c in core.vendor_baselines(p)] == ["torch", "cublas_tn", "cublas_nn"]
    assert [c.name for c in core.vendor_baselines(p, ("cublas_nn", "torch"))] == ["torch", "cublas_nn"]
    assert core.vendor_baselines(p, ()) == []


class _NoPrepare(FnCandidate):
    def prepare(self, problem, bufs, protocol, timer):
        raise RuntimeError("no plan")


def test_measure_problem_rows_on_cpu():
    p = GemmProblem(8, 16, 24, layout="nn")
    bufs = make_buffers(p, "cpu", seed=0)
    cands = [FnCandidate("cublas_nn", "nn", _mm), FnCandidate("cublas_tn", "tn", _mm),
             FnCandidate("cublaslt_heuristic_nn", "nn", _mm, extra={"algo": "h1", "n_algos": 1}),
             FnCandidate("cublaslt_heuristic_tn", "tn", _mm),
             FnCandidate("cublaslt_autotuned_nn", "nn", _mm), FnCandidate("cublaslt_autotuned_tn", "tn", _mm),
             FnCandidate("mine", "nn", _mm), FnCandidate("rejected", "nn", _mm), _NoPrepare("broken", "nn", _mm)]
    base = {**core.base_row(p, "offline", {"gpu": "cpu"}, 0, FAST), "sm_clock_mhz": ""}
    rows = core.measure_problem(p, "offline", cands, bufs, FAST,
                                lambda c, q: (c.name != "rejected", "" if c.name != "rejected" else "wrong product"),
                                math.nan, base)
    first = [r for r in rows if not r.get("recheck")]
    by = {r["candidate"]: r for r in first}
    assert by["broken"]["verified"] is False and by["broken"]["reason"] == "prepare failed: RuntimeError: no plan"
    assert by["rejected"]["verified"] is False and by["rejected"]["reason"] == "wrong product"
    assert "time_ms" not in by["rejected"] and "time_ms" not in by["broken"]
    mine = by["mine"]
    assert mine["verified"] is True and mine["time_ms"] > 0 and mine["floor_ok"] is True
    assert math.isnan(mine["floor_ms"]) and mine["sm_clock_mhz"] == "/"
    info = dict(kv.split("=", 1) for kv in mine["info"].split(";"))
    assert int(info["timing_seed"]) >= 0 and int(info["output_checks"]) >= 1  # the seed drawn, outputs checked
    assert "prep_ms" in info and "verify_ms" in info
    # offline: ours timed in one loop per vendor path, reported from the loop of the one vendor_best picks
    assert info["host_loop"] == "pairs" and info["paired_with"] == _agg_of(first)["vendor_best"]["members"]
    assert all("host_loop=pairs" in r["info"] and "paired_with" not in r["info"] for r in first
               if r["candidate"].startswith("cublas") and not r.get("members"))
    assert (by["cublaslt_heuristic_nn"]["algo"], by["cublaslt_heuristic_nn"]["n_algos"]) == ("h1", 1)
    assert list(mine)[:len(base)] == list(base)  # every row starts with the base columns, in their order
    assert all(r["timestamp"] for r in rows)
    # sm_clock_mhz: the clock before the run / after it (empty on the CPU); a row never timed keeps the base's
    assert {r["candidate"] for r in rows if r["sm_clock_mhz"] != "/"} == {"rejected", "broken"}
    assert by["broken"]["sm_clock_mhz"] == ""
    # the candidates that were not timed (as they failed), the timed ones (in order), then the aggregates
    names = [r["candidate"] for r in first]
    assert names == ["rejected", "broken"] + [c.name for c in cands[:7]] + list(AGGREGATES)
    agg = {r["candidate"]: r for r in first if r.get("members")}
    for a, r in agg.items():
        assert r["members"] in AGGREGATES[a] and r["tflops"] == max(by[m]["tflops"] for m in AGGREGATES[a] if m in by)
        assert r["time_ms"] == by[r["members"]]["time_ms"]
    # the noise rule re-measures every member of both sides RECHECKS times exactly when autotuned was slower
    rechecks = [r for r in rows if r.get("recheck")]
    slower = agg["cublaslt_autotuned"]["tflops"] < agg["cublaslt_heuristic"]["tflops"]
    want = (AGGREGATES["cublaslt_autotuned"] + AGGREGATES["cublaslt_heuristic"]) * core.RECHECKS if slower else ()
    assert sorted(r["candidate"] for r in rechecks) == sorted(want)
    assert sorted({r["recheck"] for r in rechecks}) == (list(range(1, core.RECHECKS + 1)) if slower else [])


def _agg_of(rows):
    return {r["candidate"]: r for r in rows if r.get("members")}


@pytest.mark.parametrize("protocol", ["offline", "server"])
@pytest.mark.parametrize("loop", ["pairs", "all"])
def test_measure_problem_host_rows_say_the_loop(monkeypatch, protocol, loop):
    from gemmrl import timing

    p = GemmProblem(4, 8, 8, layout="nn")
    bufs = make_buffers(p, "cpu", seed=0)
    loops, real = [], timing.time_host
    monkeypatch.setattr(timing, "time_host", lambda fns, *a, **k: (loops.append(sorted(fns)), real(fns, *a, **k))[1])
    cands = [FnCandidate("cublas_tn", "tn", _mm), FnCandidate("cublas_nn", "nn", _mm), FnCandidate("mine", "nn", _mm),
             FnCandidate("theirs", "nn", _mm)]
    pin = hasattr(os, "sched_setaffinity")
    cfg = TimingConfig(warmup_s=0.0, benchmark_s=0.01, qps=1e4, host_loop=loop, pin_cpu=pin)
    rows = core.measure_problem(p, protocol, cands, bufs, cfg, lambda c, q: (True, ""), math.nan,
                                {**core.base_row(p, protocol, {}, 0, cfg), "sm_clock_mhz": ""},
                                baselines=("cublas_tn", "cublas_nn"))
    first = {r["candidate"]: r for r in rows if not r.get("recheck") and not r.get("members")}
    assert all(f"host_loop={loop}" in r["info"] and ("pinned_cpu=" in r["info"]) == pin for r in first.values())
    if loop == "pairs":
        assert loops[:2] in ([["cublas_tn", "mine", "theirs"], ["cublas_nn", "mine", "theirs"]],
                             [["cublas_nn", "mine", "theirs"], ["cublas_tn", "mine", "theirs"]])
        best = _agg_of(rows)["cublas"]["members"]  # the faster of the two: vendor_best without the others
        assert all(f"paired_with={best}" in first[k]["info"] for k in ("mine", "theirs"))
    else:
        assert loops[0] == ["cublas_nn", "cublas_tn", "mine", "theirs"]
        assert not any("paired_with" in r["info"] for r in first.values())


def test_measure_problem_restricted_baselines_write_no_partial_aggregate():
    p = GemmProblem(4, 4, 4)
    bufs = make_buffers(p, "cpu", seed=0)
    cands = [FnCandidate("cublas_tn", "tn", _mm), FnCandidate("cublas_nn", "nn", _mm)]
    base = {**core.base_row(p, "offline", {}, 0, FAST), "sm_clock_mhz": "1"}
    rows = core.measure_problem(p, "offline", cands, bufs, FAST, lambda c, q: (True, ""), math.nan, base,
                                baselines=("cublas_tn", "cublas_nn"))
    assert [r["candidate"] for r in rows] == ["cublas_tn", "cublas_nn", "cublas"]
    assert all(r["sm_clock_mhz"] == "1/" for r in rows)


@pytest.mark.parametrize("protocol", ["offline", "server"])
def test_ours_and_vendor_bests_member_are_rechecked_at_every_shape_even_when_ours_is_ahead(monkeypatch, protocol):
    """vendor_best is a winner chosen on the first run: its member and gemmrl are re-measured head to head at every
    shape, RECHECKS times (the pair's figure from other runs), whether gemmrl led or trailed on the first run."""
    from gemmrl import timing

    p = GemmProblem(4, 8, 8, layout="nn")
    bufs = make_buffers(p, "cpu", seed=0)
    real = timing.measure

    def fake(fns, bufs, protocol, cfg=None, layouts=None, ours=None):  # gemmrl twice as fast as any vendor path
        got = real(fns, bufs, protocol, cfg, layouts, ours)
        return {k: dataclasses.replace(v, time_ms=v.time_ms / (2 if k == "gemmrl" else 1),
                                       tflops=v.tflops * (2 if k == "gemmrl" else 1)) for k, v in got.items()}

    monkeypatch.setattr(core, "measure", fake)
    from gemmrl.summary import BASELINES

    cands = [FnCandidate(n, n[-2:] if n != "torch" else "nn", _mm) for n in BASELINES] + [FnCandidate("gemmrl", "nn", _mm)]
    cfg = TimingConfig(warmup_s=0.0, benchmark_s=0.002, qps=1e4)
    rows = core.measure_problem(p, protocol, cands, bufs, cfg, lambda c, q: (True, ""), math.nan,
                                {**core.base_row(p, protocol, {}, 0, cfg), "sm_clock_mhz": ""})
    first = {r["candidate"]: r for r in rows if not r.get("recheck")}
    assert first["gemmrl"]["tflops"] > first["vendor_best"]["tflops"]  # ahead on the first run
    member = first["vendor_best"]["members"]
    again = {(r["recheck"], r["candidate"]) for r in rows if r.get("recheck")}  # (other pairs may recheck too)
    assert {(k, c) for k in range(1, core.RECHECKS + 1) for c in ("gemmrl", member)} <= again
    assert sorted(r["recheck"] for r in rows if r.get("recheck") and r["candidate"] == "gemmrl") == \
        list(range(1, core.RECHECKS + 1))
