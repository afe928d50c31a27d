"""Timing protocols: statistics and floors on the CPU; every protocol on the GPU."""

import math
import os
import time
from dataclasses import replace
from typing import Callable

import pytest
import torch

from gemmrl import timing
from gemmrl.candidate import make_buffers, refill
from gemmrl.problem import GemmProblem, parse_mnk
from gemmrl.timing import (TimingConfig, TimingError, _quantile, _summary, below_floor, floor_ms, make_timer,
                           measure)


def test_quantile_and_summary():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert _quantile(xs, 0.0) == 1.0 and _quantile(xs, 1.0) == 5.0 and _quantile(xs, 0.5) == 3.0
    assert _quantile(xs, 0.2) == pytest.approx(1.8)
    med = _summary("graph", xs, flops=2e9, mean=False)
    assert med.time_ms == 3.0 and med.tflops == pytest.approx(2e9 / 3e-3 / 1e12) and med.n == 5
    mean = _summary("offline", [1.0, 3.0], flops=2e9, mean=True)
    assert mean.time_ms == 2.0
    # CUDA-L2's statistic: mean of per-call TFLOPS, not TFLOPS of the mean time
    assert mean.tflops == pytest.approx((2e9 / 1e-3 + 2e9 / 3e-3) / 2 / 1e12)


def test_floor():
    p = GemmProblem(64, 4096, 4096)
    cold = floor_ms(p, "H100", "cold", l2=50 * 2**20)
    graph = floor_ms(p, "H100", "graph", l2=50 * 2**20)
    assert cold == pytest.approx(p.bytes / 3.35e12 * 1e3)
    assert graph == pytest.approx(p.flops / 989e12 * 1e3) and graph < cold  # 33.6 MB fits in 50 MB of L2
    big = GemmProblem(4096, 4096, 16384)  # operands do not fit in L2: bytes term kept
    assert floor_ms(big, "H100", "graph", l2=50 * 2**20) == pytest.approx(big.floor_s("H100") * 1e3)
    assert below_floor(0.9, 1.0) and not below_floor(0.96, 1.0) and not below_floor(math.inf, 1.0)


def test_unknown_protocol():
    b = make_buffers(GemmProblem(2, 2, 2), "cpu")
    with pytest.raises(TimingError, match="unknown protocol"):
        measure({}, b, "warm")


def test_host_protocol_on_cpu_records_failures_and_timer():
    b = make_buffers(GemmProblem(8, 8, 8), "cpu")

    def good():
        b.c.copy_((b.a.float() @ b.b.float()).to(b.c.dtype))

    def bad():
        raise RuntimeError("boom")

    cfg = TimingConfig(warmup_s=0.0, benchmark_s=0.01)
    res = measure({"good": good, "bad": bad}, b, "offline", cfg)
    assert res["good"].ok and res["good"].n >= 1
    assert not res["bad"].ok and "boom" in res["bad"].reason and math.isinf(res["bad"].time_ms)
    t = make_timer(b, "offline", cfg)({"good": good}, 20)
    assert 0 < t["good"] < math.inf


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
@pytest.mark.parametrize("protocol", ["offline", "server"])
def test_a_pinned_host_loop_runs_on_one_cpu_and_gives_the_others_back(protocol):
    b = make_buffers(GemmProblem(8, 8, 8), "cpu")
    before, seen = os.sched_getaffinity(0), []

    def good():
        seen.append(frozenset(os.sched_getaffinity(0)))
        b.c.copy_((b.a.float() @ b.b.float()).to(b.c.dtype))

    cfg = TimingConfig(warmup_s=0.0, benchmark_s=0.01, qps=1e4, pin_cpu=True)
    res = measure({"good": good}, b, protocol, cfg)
    assert res["good"].ok and set(seen) == {frozenset({max(before)})}
    assert res["good"].extra["pinned_cpu"] == max(before) and os.sched_getaffinity(0) == before
    seen.clear()
    res = measure({"good": good}, b, protocol, TimingConfig(warmup_s=0.0, benchmark_s=0.01, qps=1e4))
    assert "pinned_cpu" not in res["good"].extra and set(seen) == {frozenset(before)}


def test_a_pinned_loop_that_raises_still_gives_the_cpus_back(monkeypatch):
    b = make_buffers(GemmProblem(8, 8, 8), "cpu")
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    monkeypatch.setattr(timing, "refill", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        measure({"x": lambda: None}, b, "offline", TimingConfig(warmup_s=0.0, benchmark_s=0.01, pin_cpu=True))
    if before is not None:
        assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize("mnk", ["1_7_13", "33_65_129"])
@pytest.mark.parametrize("last", ["tn", "nn"])
def test_refill_writes_both_forms_of_b_alike_whichever_comes_last(mnk, last):
    b = make_buffers(parse_mnk(mnk), "cpu", seed=1)
    old = b.b.clone()
    refill(b, torch.Generator().manual_seed(2), last=last)
    assert torch.equal(b.b, b.bt.t()) and not torch.equal(b.b, old)
    assert torch.isnan(b.c).all()
    with pytest.raises(ValueError, match="use 'tn' or 'nn'"):
        refill(b, last="bt")


def test_host_loop_alternates_the_form_of_b_written_last(monkeypatch):
    import gemmrl.timing as timing

    seen = []
    real = timing.refill
    monkeypatch.setattr(timing, "refill", lambda bufs, gen, last: (seen.append(last), real(bufs, gen, last)))
    b = make_buffers(GemmProblem(4, 8, 8), "cpu")
    make_timer(b, "offline")({"nothing": lambda: None}, 60)
    assert len(seen) >= 60 and {"tn", "nn"} == set(seen)
    assert 0.25 < seen.count("nn") / len(seen) < 0.75  # a fair coin: 60 draws leave this range once in ~10^4


def test_settle_runs_every_callable_until_the_time_is_spent(monkeypatch):
    import time

    from gemmrl import timing

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    ran = {"a": 0, "b": 0}
    fns = [lambda: ran.__setitem__("a", ran["a"] + 1), lambda: (ran.__setitem__("b", ran["b"] + 1), time.sleep(0.002))]
    t0 = time.perf_counter()
    timing._settle(fns, 20.0)
    assert (time.perf_counter() - t0) * 1e3 >= 20.0 and ran["a"] == ran["b"] >= 5
    ran.update(a=0, b=0)
    timing._settle(fns, 0.0)  # at least one round, even with no time asked
    assert ran == {"a": 1, "b": 1}
    timing._settle([], 1e9)  # nothing to run: returns at once
    # with a clock: on past the minimum until 4 readings agree within 1%, or the maximum
    mhz = iter([1980, 1900, 1700, 1500, 1420, 1425, 1423, 1421, 1426, 1420, 1424, 1422] + [1421] * 1000)
    t0 = time.perf_counter()
    info = timing._settle([lambda: time.sleep(0.01)], 0.0, max_ms=5000.0, clock=lambda: float(next(mhz)))
    assert info["mhz"] in (1421.0, 1422.0) and 500 <= (time.perf_counter() - t0) * 1e3 < 2500
    falling = iter(range(2000, 0, -50))
    info = timing._settle([lambda: time.sleep(0.01)], 0.0, max_ms=200.0, clock=lambda: float(next(falling)))
    assert 200.0 <= info["settle_ms"] < 400.0  # never stable: stops at the maximum


def test_selection_timer_uses_fresh_rounds_and_the_median(monkeypatch):
    from gemmrl import timing

    b = make_buffers(GemmProblem(8, 8, 8), "cpu")
    seen = []

    def fake_host(fns, bufs, cfg, protocol, min_calls=0):
        seen.append((cfg.seed, cfg.settle_ms, cfg.warmup_s, min_calls))
        return {k: timing._summary(protocol, [1.0, 1.0, 100.0], 2e9, mean=True) for k in fns}

    monkeypatch.setattr(timing, "time_host", fake_host)
    timer = make_timer(b, "offline", TimingConfig(settle_ms=500.0, seed=5))
    t1, t2 = timer({"x": lambda: None}, 20), timer({"x": lambda: None}, 20)
    assert t1 == t2 == {"x": 1.0}  # the median, not the mean (34.0) that one outlier drags
    assert seen[0][0] != seen[1][0] and seen[0][1] == timing.SELECT_SETTLE_MS and seen[0][2:] == (0.0, 20)
    seen.clear()
    fresh = make_timer(b, "offline", TimingConfig())  # no seed given: each round's is drawn when it runs
    fresh({"x": lambda: None}, 20)
    assert seen[0][0] is None


# -- GPU tier ------------------------------------------------------------------------------------

def _mm(b):
    return lambda: torch.matmul(b.a, b.b, out=b.c)


def _mm_twice(b):
    def f():
        torch.matmul(b.a, b.b, out=b.c)
        torch.matmul(b.a, b.b, out=b.c)
    return f


def test_quick_statistics_keep_the_protocol_and_cost_less():
    d, q = TimingConfig(seed=3, qps=50.0), TimingConfig(seed=3, qps=50.0).quick()
    assert q.graph_min_timed_ms < d.graph_min_timed_ms and q.settle_ms < d.settle_ms
    assert q.graph_min_work_ms < d.graph_min_work_ms and q.settle_max_ms <= 200.0
    # still DESIGN.md's graph protocol: >= 1 ms of work per replay, >= 10 replays
    assert q.graph_min_work_ms >= 1.0 and q.graph_replays >= 10
    assert (q.cold_calls, q.seed, q.qps, q.warmup_s, q.benchmark_s) == (d.cold_calls, 3, 50.0, d.warmup_s, d.benchmark_s)


@pytest.mark.gpu
def test_quick_timing_is_recorded_in_graph_rows(tmp_path):
    from gemmrl.measure.bench import BenchSpec, run_bench
    from gemmrl.results import read_rows

    spec = BenchSpec(problems=(parse_mnk("256_512_1024"),), protocols=("graph",), out=tmp_path / "q.csv",
                     cfg=TimingConfig().quick())
    rows = [r for r in read_rows([run_bench(spec, progress=False)]) if r["protocol"] == "graph" and r["n"]]
    assert rows and all("min_timed_ms=100" in r["info"] for r in rows if r["verified"] == "true")


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", ["64_4096_64", "1024_1024_1024", "64_4096_4096", "4096_4096_4096"])
@pytest.mark.parametrize("protocol", ["graph", "cold", "offline", "server"])
def test_protocols_above_floor_and_slow_is_slower(mnk, protocol):
    p = parse_mnk(mnk)
    b = make_buffers(p, "cuda")
    cfg = TimingConfig(warmup_s=0.05, benchmark_s=0.3, qps=500)
    res = measure({"mm": _mm(b), "mm2": _mm_twice(b)}, b, protocol, cfg)
    gpu = torch.cuda.get_device_name()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    fl = floor_ms(p, gpu, protocol, l2)
    for name in ("mm", "mm2"):
        assert res[name].ok, res[name].reason
        assert res[name].time_ms >= 0.95 * fl, (name, res[name].time_ms, fl)
    assert res["mm2"].time_ms > 1.3 * res["mm"].time_ms or (protocol in ("offline", "server") and p.flops < 1e10
                                                            and res["mm2"].time_ms > res["mm"].time_ms)


@pytest.mark.gpu
def test_graph_rejects_a_candidate_that_synchronizes():
    b = make_buffers(parse_mnk("256_256_256"), "cuda")

    def syncing():
        torch.matmul(b.a, b.b, out=b.c)
        torch.cuda.synchronize()

    res = measure({"ok": _mm(b), "sync": syncing}, b, "graph", TimingConfig())
    assert res["ok"].ok
    assert not res["sync"].ok and "not capturable" in res["sync"].reason


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", ["2048_2048_2048", "4096_4096_4096"])
def test_graph_repeatable(mnk):
    """The repeatability bar (3%) at the shapes where clock settling matters most (power-bound)."""
    b = make_buffers(parse_mnk(mnk), "cuda")
    t1 = measure({"mm": _mm(b)}, b, "graph", TimingConfig(seed=1))["mm"].time_ms
    t2 = measure({"mm": _mm(b)}, b, "graph", TimingConfig(seed=2))["mm"].time_ms
    assert abs(t1 - t2) / min(t1, t2) < 0.03


@pytest.mark.gpu
def test_graph_rejects_work_outside_the_current_stream():
    """Work launched on another stream is not captured (or breaks the capture): never timed as a result."""
    b = make_buffers(parse_mnk("512_512_512"), "cuda")

    def elsewhere():
        with torch.cuda.stream(torch.cuda.default_stream()):
            torch.matmul(b.a, b.b, out=b.c)

    res = measure({"ok": _mm(b), "elsewhere": elsewhere}, b, "graph", TimingConfig(graph_replays=3))
    assert res["ok"].ok
    assert not res["elsewhere"].ok, res["elsewhere"]


def test_a_late_sample_is_taken_again_with_a_longer_busy_window(monkeypatch):
    """_event_ms: a sample whose start event fired before the work was enqueued (the host fell behind the busy
    window) is retaken with a 4x, then 16x longer window, the flush (``before``) run ahead of every attempt, and
    counted; one still late after the retries is kept and counted as such."""
    from gemmrl import timing

    script = iter([(5.0, True), (1.0, False),                  # late once, then clean
                   (9.0, True), (8.0, True), (7.0, True),      # late every time: the last is kept
                   (2.0, False)])                              # clean at once
    windows, flushes = [], []

    def sample(fn, busy_us=timing.BUSY_US):
        windows.append(busy_us)
        return next(script)

    monkeypatch.setattr(timing, "_event_sample", sample)
    late = [0, 0]
    got = [timing._event_ms(lambda: None, late, before=lambda: flushes.append(1)) for _ in range(3)]
    assert got == [1.0, 7.0, 2.0] and late == [2, 1] and len(flushes) == 6
    b = timing.BUSY_US
    assert windows == [b, 4 * b, b, 4 * b, 16 * b, b]
    assert timing._late_info(late) == {"late_retaken": 2, "late_kept": 1} and timing._late_info([0, 0]) == {}


@pytest.mark.gpu
def test_a_host_slower_than_the_busy_window_is_caught_not_timed():
    """A call whose host side takes 5 ms before it launches (longer than any busy window) is late every time: the
    samples are retaken, then kept and counted, and the row says so; a plain matmul is not late."""
    import time as _time

    b = make_buffers(parse_mnk("256_256_256"), "cuda")

    def slow_host():
        _time.sleep(0.005)
        torch.matmul(b.a, b.b, out=b.c)

    res = measure({"mm": _mm(b), "slow": slow_host}, b, "cold", TimingConfig(cold_calls=5, settle_ms=1))
    assert res["slow"].extra.get("late_kept") == res["slow"].n == 5
    assert res["slow"].time_ms > 4.0   # the host's sleep sits inside the timed region: counted, and now flagged
    assert not res["mm"].extra.get("late_kept")


# -- offline/server: one loop per baseline (CUDA-L2's harness) ----------------------------------------------------

def _spin(ms: float) -> None:
    end = time.perf_counter() + ms * 1e-3
    while time.perf_counter() < end:
        pass


def _paths(b, ms: dict[str, float], fail: Callable[[str], str] = lambda name: ""):
    """Callables that compute C and take ``ms[name]`` ms; ``fail(name)`` -> "raise" or "wrong" breaks that call."""
    def make(name):
        def call():
            _spin(ms[name])
            how = fail(name)
            if how == "raise":
                raise RuntimeError(f"{name} broke")
            b.c.copy_((b.a.float() @ b.b.float()).to(b.c.dtype))
            if how == "wrong":
                b.c.zero_()
        return call
    return {k: make(k) for k in ms}


def _record_loops(monkeypatch):
    """Every time_host loop as (names in it, its seed); ``now`` holds the names of the loop running."""
    loops, now, real = [], [], timing.time_host

    def spy(fns, bufs, cfg, protocol, min_calls=0):
        loops.append((frozenset(fns), cfg.seed))
        now[:] = [frozenset(fns)]
        return real(fns, bufs, cfg, protocol, min_calls)

    monkeypatch.setattr(timing, "time_host", spy)
    return loops, now


PAIR_MS = {"mine": 0.2, "slow": 1.2, "mid": 0.7, "fast": 0.3}
PAIR_CFG = TimingConfig(warmup_s=0.0, benchmark_s=0.02, qps=1e4)


@pytest.mark.parametrize("protocol", ["offline", "server"])
def test_pairs_time_ours_against_each_baseline_in_a_loop_of_its_own(monkeypatch, protocol):
    b = make_buffers(GemmProblem(8, 8, 8), "cpu")
    loops, _ = _record_loops(monkeypatch)
    res = measure(_paths(b, PAIR_MS), b, protocol, replace(PAIR_CFG, seed=11), ours=["mine"])
    assert sorted(sorted(names) for names, _ in loops) == [["fast", "mine"], ["mid", "mine"], ["mine", "slow"]]
    assert sorted(seed for _, seed in loops) == [11 + timing.PAIR_SEED_STEP * i for i in (1, 2, 3)]
    assert all(t.ok and t.extra["host_loop"] == "pairs" for t in res.values()) and list(res) == list(PAIR_MS)
    assert res["fast"].tflops > res["mid"].tflops > res["slow"].tflops
    assert res["mine"].extra["paired_with"] == "fast"  # the loop of the baseline vendor_best picks
    assert not any("paired_with" in res[k].extra for k in ("slow", "mid", "fast"))
    # each baseline's Timing from its own loop: distinct seeds
    assert len({res[k].extra["seed"] for k in ("slow", "mid", "fast")}) == 3
    assert res["mine"].extra["seed"] == res["fast"].extra["seed"]


def test_pairs_shuffle_the_order_of_the_loops(monkeypatch):
    b = make_buffers(GemmProblem(4, 4, 4), "cpu")
    loops, _ = _record_loops(monkeypatch)
    ms = {"mine": 0.0, **{f"v{i}": 0.0 for i in range(6)}}
    cfg = TimingConfig(warmup_s=0.0, benchmark_s=0.0)
    firsts = set()
    for _ in range(6):
        loops.clear()
        measure(_paths(b, ms), b, "offline", cfg, ours=["mine"])
        firsts.add(next(iter(loops[0][0] - {"mine"})))
    assert len(firsts) > 1  # the same first loop six times: once in 6^5


@pytest.mark.parametrize("ours, loop", [(["mine"], "all"), (None, "pairs"), ([], "pairs"),
                                        (list(PAIR_MS), "pairs")])
def test_one_loop_with_host_loop_all_or_without_ours_or_baselines(monkeypatch, ours, loop):
    b = make_buffers(GemmProblem(8, 8, 8), "cpu")
    loops, _ = _record_loops(monkeypatch)
    res = measure(_paths(b, PAIR_MS), b, "offline", replace(PAIR_CFG, host_loop=loop), ours=ours)
    assert [names for names, _ in loops] == [frozenset(PAIR_MS)]
    assert all(t.ok and t.extra["host_loop"] == "all" and "paired_with" not in t.extra for t in res.values())


@pytest.mark.parametrize("how", ["raise", "wrong"])
def test_ours_failing_in_one_loop_is_failed(monkeypatch, how):
    b = make_buffers(GemmProblem(8, 8, 8), "cpu")
    loops, now = _record_loops(monkeypatch)
    res = measure(_paths(b, PAIR_MS, lambda name: how if name == "mine" and "mid" in now[0] else ""), b, "offline",
                  PAIR_CFG, ours=["mine"])
    t = res["mine"]
    assert not t.ok and math.isinf(t.time_ms) and "paired_with" not in t.extra and t.extra["host_loop"] == "pairs"
    assert ("mine broke" in t.reason) if how == "raise" else (t.extra["output_wrong"] and "timed_output" in t.reason)
    assert all(res[k].ok for k in ("slow", "mid", "fast")) and len(loops) == 3
    after = [names for names, _ in loops[[names for names, _ in loops].index(frozenset({"mine", "mid"})) + 1:]]
    assert all("mine" not in names for names in after)  # left out of the loops after its failure


def test_host_loop_is_checked():
    assert TimingConfig().host_loop == "pairs" and TimingConfig(host_loop="all").host_loop == "all"
    with pytest.raises(TimingError, match="host_loop must be one of pairs, all, got 'crowd'"):
        TimingConfig(host_loop="crowd")


@pytest.mark.gpu
@pytest.mark.parametrize("mnk", ["182_6144_4096", "7_33_65"])
def test_refilled_times_each_call_after_the_host_loops_refill_gpu(mnk, monkeypatch):
    """time_refilled (the layout choice's timing for the host protocols): every timed call follows the host loop's
    own refill (both forms of B, the last one drawn at random), no flush; finite medians above the roofline floor."""
    b = make_buffers(parse_mnk(mnk), "cuda")
    lasts = []
    real = timing.refill
    monkeypatch.setattr(timing, "refill", lambda bufs, gen=None, last="tn": (lasts.append(last), real(bufs, gen, last))[1])
    monkeypatch.setattr(timing, "_flush_buffer", lambda: pytest.fail("time_refilled flushed L2"))
    cfg = TimingConfig(cold_calls=12, settle_ms=5.0, seed=3)
    got = timing.time_refilled({"tn": lambda: torch.matmul(b.a, b.bt.t(), out=b.c),
                                "nn": lambda: torch.matmul(b.a, b.b, out=b.c)}, b, cfg)
    assert all(t.ok and t.n == 12 and t.time_ms > 0 for t in got.values()), got
    assert len(lasts) >= 24 and set(lasts) == {"tn", "nn"}
    p = parse_mnk(mnk)
    assert min(t.time_ms for t in got.values()) >= 0.95 * p.flops / 989e12 * 1e3
