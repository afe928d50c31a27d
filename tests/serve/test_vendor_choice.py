"""The vendor fallback (serve/vendor_choice.py): buckets of M at every edge, the race (fastest median, plans that fail
are out, the first-call cap), the choice cache (per GPU, driver and cuBLASLt; an unreadable file set aside with one
warning; an unwritable one costs a race, not a failure), the settings, and the dispatcher serving a shape with no
entry through it (raced once per bucket, nothing raced inside capture). CPU tier: the plans are stand-ins and the
device says it is CUDA; the GPU tier's test of the real plans is in test_dispatch.py."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import types
import weakref
import warnings

import pytest
import torch

from gemmrl.candidate import make_buffers
from gemmrl.library import Library
from gemmrl.problem import GemmProblem
from gemmrl.kernels.triton_gemm.configs import Arch
from gemmrl.serve import dispatch, launch_bound, launchers
from gemmrl.serve import vendor_choice as VC
from gemmrl.serve.launchers import DispatchError

IDENT = VC.Identity("NVIDIA H200", 580159, 130100)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(VC.MODE_ENV, raising=False)
    monkeypatch.delenv(VC.RACE_MS_ENV, raising=False)


def P(M, N=4096, K=4096, dtype="fp16", layout="tn"):
    return GemmProblem(M, N, K, dtype=dtype, acc="fp32", layout=layout)


@pytest.mark.parametrize("M, bucket", [(1, (1, 1)), (2, (2, 3)), (3, (2, 3)), (4, (4, 7)), (7, (4, 7)), (8, (8, 15)),
                                       (15, (8, 15)), (16, (16, 31)), (1023, (512, 1023)), (1024, (1024, 2047)),
                                       (16383, (8192, 16383)), (16384, (16384, 32767))])
def test_m_buckets_at_their_edges(M, bucket):
    assert VC.m_bucket(M) == bucket
    assert VC.choice_key(P(M)) == VC.choice_key(P(bucket[0])) == VC.choice_key(P(bucket[1]))
    assert VC.choice_key(P(bucket[1] + 1)) != VC.choice_key(P(M))


def test_the_key_holds_dtype_layout_n_and_k():
    keys = {VC.choice_key(p) for p in (P(5), P(5, dtype="bf16"), P(5, layout="nn"), P(5, N=4097), P(5, K=11))}
    assert len(keys) == 5
    with pytest.raises(ValueError):
        VC.m_bucket(0)


class Clock:
    def __init__(self, step):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


def _timer(times):
    return lambda fn: times[fn.__name__] * (1.0 + 0.001 * fn())  # fn() returns a jitter step


def _plans(times, calls):
    def make(name):
        def fn():
            calls[name] = calls.get(name, 0) + 1
            if times[name] is None:
                raise RuntimeError("cannot run this shape")
            return calls[name] % 3
        fn.__name__ = name
        return fn
    return {n: make(n) for n in times}


def test_the_race_picks_the_fastest_median_and_drops_plans_that_fail():
    times = {"torch": 0.030, "cublas": 0.020, "cublaslt#0 a": 0.018, "cublaslt#1 b": 0.012, "cublaslt#2 c": None}
    calls = {}
    win, med = VC.race(_plans(times, calls), _timer(times), budget_s=1.0, clock=Clock(0.0))
    assert win == "cublaslt#1 b" and set(med) == set(times) - {"cublaslt#2 c"}
    assert med["cublaslt#1 b"] == pytest.approx(12.0, rel=0.01)  # microseconds
    assert calls["torch"] == VC.MAX_ROUNDS + 1 and calls["cublaslt#2 c"] == 1  # one untimed call each first


def test_a_timer_that_times_a_round_in_one_go_gets_each_round_whole():
    times = {"torch": 0.030, "cublas": 0.020, "cublaslt#0 a": 0.018, "cublaslt#1 b": 0.012}
    rounds = []

    class Many:
        def __call__(self, fn):
            raise AssertionError("a round is timed in one go")

        def many(self, fns):
            rounds.append([f.__name__ for f in fns])
            return [times[f.__name__] for f in fns]

    best, med = VC.race(_plans(times, {}), Many(), budget_s=0.0)
    assert best == "cublaslt#1 b" and med["cublaslt#1 b"] == pytest.approx(12.0)
    assert len(rounds) == VC.SCREEN_ROUNDS + VC.MIN_ROUNDS - 1
    assert rounds[0] == list(times) and rounds[1] == list(reversed(times))  # interleaved: one order, then the other


def test_a_flushed_form_is_made_once_and_does_not_keep_its_plan_alive():
    timer, calls = VC.GraphTimer(1.0, flushed=True), []

    def plan():
        calls.append(1)
    form = timer._form(plan)
    assert timer._form(plan) is form and VC.GraphTimer(1.0)._form(plan) is plan  # the warm timer times plan itself
    alive = weakref.ref(plan)
    del plan, form
    gc.collect()
    assert alive() is None and len(VC._COLD) == 0  # the race's operands die with its plans


def test_the_first_round_screens_and_the_fastest_go_on():
    times = {f"cublaslt#{i} algo={i}": 0.010 + 0.001 * ((i * 7) % 18) for i in range(16)}
    times.update(torch=0.05, cublas=0.011)
    calls = {}
    win, med = VC.race(_plans(times, calls), _timer(times), budget_s=1.0, clock=Clock(0.0))
    kept = sorted(times, key=times.get)[:VC.KEEP]
    assert win == kept[0] and set(med) == set(kept)
    assert all(calls[n] == VC.MAX_ROUNDS + 1 for n in kept)
    assert all(calls[n] == 1 + VC.SCREEN_ROUNDS for n in times if n not in kept)  # untimed call, screening samples


def test_the_race_stops_at_its_cap_after_the_minimum_rounds():
    times = {"torch": 0.03, "cublas": 0.02}
    calls = {}
    VC.race(_plans(times, calls), _timer(times), budget_s=0.5, clock=Clock(1.0))  # every round "takes" 1 s
    rounds = VC.SCREEN_ROUNDS + VC.MIN_ROUNDS - 1
    assert calls == {"torch": rounds + 1, "cublas": rounds + 1}
    with pytest.raises(RuntimeError, match="no vendor plan"):
        VC.race(_plans({"torch": None}, {}), _timer({"torch": None}), 1.0)


def test_screening_keeps_a_plan_by_its_faster_sample_and_the_clocks_settle_first():
    """On an H200 the race began at idle clocks: the plans timed first (torch, cublas, cuBLASLt's first) read slow in
    a one-sample screen and were dropped, and slower plans won (2_2048_1408: 5.0 us against 4.2 us)."""
    times = {f"cublaslt#{i} algo={i}": 0.012 + 0.0001 * i for i in range(1, 12)}
    times.update({"torch": 0.0101, "cublas": 0.0105, "cublaslt#0 algo=0": 0.010})
    calls, first = {}, {}
    idle = {"left": 3}  # the first three timed samples (the first round's first plans) read 3x slow

    def timer(fn):
        slow = 3.0 if idle["left"] > 0 else 1.0
        idle["left"] -= 1
        return times[fn.__name__] * slow * (1.0 + 0.001 * fn())

    win, med = VC.race(_plans(times, calls), timer, budget_s=1.0, clock=Clock(0.0),
                       settle=lambda fn: first.setdefault("fn", fn.__name__))
    assert first == {"fn": "cublaslt#1 algo=1"} and win == "cublaslt#0 algo=0"
    assert {"torch", "cublas", "cublaslt#0 algo=0"} <= set(med)


@pytest.mark.parametrize("challenger, wins", [(0.00995, False), (0.0098, True)])
def test_a_plan_beats_the_defaults_only_by_more_than_the_tie_band(challenger, wins):
    times = {"torch": 0.0103, "cublas": 0.0101, "cublaslt#0 a": 0.0100, "cublaslt#5 b": challenger}
    win, _ = VC.race(_plans(times, {}), _timer(times), budget_s=1.0, clock=Clock(0.0))
    assert win == ("cublaslt#5 b" if wins else "cublaslt#0 a")


@pytest.mark.parametrize("extra, want", [({}, "cublas"), ({"cublas": 4.0}, "cublaslt#0 a"),
                                         ({"cublas": 0.05}, "cublas"), ({"cublas": 4.0, "torch": 9.0}, "cublaslt#0 a")])
def test_the_host_charge_decides_between_plans_that_tie_on_the_gpu(extra, want):
    """An eager call pays its host work before its kernel starts: cublasGemmEx ties cuBLASLt's plan in device time
    (10.0 against 10.05 us, inside the tie band) and loses once its extra host time per call is added."""
    times = {"torch": 0.0110, "cublas": 0.01000, "cublaslt#0 a": 0.01005, "cublaslt#3 b": 0.0120}
    win, med = VC.race(_plans(times, {}), _timer(times), budget_s=1.0, clock=Clock(0.0), extra_us=extra)
    assert win == want and med["cublas"] == pytest.approx(10.0, rel=0.01)  # the medians carry no charge


class HostClock:
    """perf_counter stand-in: each plan's call advances it by that plan's host time (us); sync advances nothing."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _host_plans(host_us, clock, calls):
    def make(name):
        def fn():
            calls.append(name)
            clock.t += host_us[name] * 1e-6
        return fn
    return {n: make(n) for n in host_us}


def test_the_host_charge_is_each_charged_plans_host_time_beyond_cublaslts_plan():
    clock, calls, syncs = HostClock(), [], []
    host = {"torch": 21.0, "cublas": 13.0, "cublaslt#0 a": 6.0, "cublaslt#4 b": 6.5, "gen#triton:x": 40.0}
    got = VC.host_extra_us(_host_plans(host, clock, calls), sync=lambda: syncs.append(1), clock=clock, calls=5)
    assert got == pytest.approx({"torch": 15.0, "cublas": 7.0})  # the cuBLASLt plans and generated kernels: none
    assert calls[1:4] == ["cublaslt#0 a", "torch", "cublas"] and len(calls) == 1 + 15  # interleaved, 5 calls each
    assert calls[0] == "cublaslt#0 a" and len(syncs) == len(calls) + 2  # each call after a synchronize: it returns
    # once its work is queued; the first, synchronized, says whether host time matters at all
    slow = dict(host, **{"cublaslt#0 a": 1500.0})  # 1.5 ms a call: a few us of host time are noise there
    assert VC.host_extra_us(_host_plans(slow, clock, []), sync=lambda: None, clock=clock) == {}
    host["cublas"] = 5.0  # leaner than the reference: never a credit
    assert VC.host_extra_us(_host_plans(host, clock, []), sync=lambda: None, clock=clock, calls=3)["cublas"] == 0.0
    no_ref = {k: v for k, v in host.items() if not k.startswith("cublaslt#0")}
    assert VC.host_extra_us(_host_plans(no_ref, clock, []), sync=lambda: None, clock=clock) == {}

    def boom():
        raise RuntimeError("cannot run this shape")
    assert VC.host_extra_us({"cublaslt#0 a": lambda: None, "cublas": boom}, sync=lambda: None, clock=clock) == {}


def test_the_cold_race_charges_host_time_and_records_it_and_the_graph_race_does_not():
    times = {"torch": 0.0110, "cublas": 0.01000, "cublaslt#0 algo=7": 0.01005}
    asked = []

    def host(plans):
        asked.append(sorted(plans))
        return {"cublas": 4.0, "torch": 9.0}
    cache = VC.ChoiceCache(IDENT)
    cold = VC.choose(P(37), cache, lambda: _plans(times, {}), _timer(times), budget_s=0.0, protocol="cold", host=host)
    assert (cold.kind, cold.algo) == ("cublaslt", "algo=7") and dict(cold.host_us) == {"cublas": 4.0, "torch": 9.0}
    assert asked == [sorted(times)]
    assert VC.ChoiceCache(IDENT).get(P(40), protocol="cold") == cold  # host_us read back from the user cache
    warm = VC.choose(P(37), cache, lambda: _plans(times, {}), _timer(times), budget_s=0.0, protocol="graph", host=host)
    assert warm.kind == "cublas" and warm.host_us == () and len(asked) == 1  # a replay has no host work
    ordered = [(x.kind, x.algo) for x in VC.in_turn(cold, most=1)]
    assert ordered[:2] == [("cublaslt", "algo=7"), ("cublas", "")]  # next fastest with the charge: cublas (14 < 20)


def test_choose_races_once_per_bucket_and_caches_per_identity():
    times = {"torch": 0.03, "cublas": 0.02, "cublaslt#0 algo=7 tile=128x64": 0.01}
    raced = []

    def plans():
        raced.append(1)
        return _plans(times, {})

    cache = VC.ChoiceCache(IDENT)
    c = VC.choose(P(37), cache, plans, _timer(times), budget_s=0.0)
    assert (c.kind, c.algo, c.how, c.measured_m) == ("cublaslt", "algo=7 tile=128x64", "raced", 37)
    assert "raced at M=37" in c.describe() and dict(c.times_us)["torch"] == pytest.approx(30.0, rel=0.01)
    assert VC.choose(P(63), cache, plans, _timer(times)) == c and len(raced) == 1  # same bucket 32..63
    VC.choose(P(64), cache, plans, _timer(times), budget_s=0.0)
    assert len(raced) == 2  # the next bucket races again
    again = VC.ChoiceCache(IDENT)  # another process: read from the user cache
    assert again.get(P(40)) == c
    other = VC.ChoiceCache(VC.Identity("NVIDIA H200", 580160, 130100))  # another driver: its own file, empty
    assert other.get(P(40)) is None and other.path != again.path


def test_modes_heuristic_and_off_do_not_race(monkeypatch):
    def plans():
        raise AssertionError("raced")

    monkeypatch.setenv(VC.MODE_ENV, "heuristic")
    c = VC.choose(P(3), VC.ChoiceCache(IDENT), plans)
    assert (c.kind, c.algo, c.how) == ("cublaslt", "", "heuristic") and "heuristic's first" in c.describe()
    monkeypatch.setenv(VC.MODE_ENV, "OFF")
    assert VC.choose(P(3), None, plans).kind == "torch"


@pytest.mark.parametrize("env, value, match", [(VC.MODE_ENV, "fast", "race.*heuristic.*off"),
                                               (VC.RACE_MS_ENV, "-5", "milliseconds"),
                                               (VC.RACE_MS_ENV, "nan", "milliseconds"),
                                               (VC.RACE_MS_ENV, "soon", "milliseconds")])
def test_bad_settings_are_one_line_errors(monkeypatch, env, value, match):
    monkeypatch.setenv(env, value)
    with pytest.raises(DispatchError, match=match) as e:
        dispatch._fallback_settings()
    assert "\n" not in str(e.value) and value in str(e.value)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"identity": {"gpu": "other"}, "choices": {}}),
                                     json.dumps({"identity": None, "choices": []}), "[]",
                                     json.dumps({"identity": dataclasses.asdict(IDENT), "choices": {}, "passed": 5})])
def test_an_unreadable_cache_is_set_aside_with_one_warning(content):
    cache = VC.ChoiceCache(IDENT)
    cache.path.write_text(content)
    with pytest.warns(RuntimeWarning, match="could not be read.*set aside") as rec:
        fresh = VC.ChoiceCache(IDENT)
    assert len([w for w in rec if issubclass(w.category, RuntimeWarning)]) == 1
    assert fresh.choices == {} and fresh.passed == set() and not fresh.path.exists()
    assert list(fresh.path.parent.glob(fresh.path.name + ".unreadable-*"))  # kept for a look, not deleted
    assert fresh.put(P(5), VC.Choice("cublas", how="raced", measured_m=5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert VC.ChoiceCache(IDENT).get(P(6)).kind == "cublas"


def test_writers_merge_and_an_unwritable_cache_is_not_an_error(tmp_path, monkeypatch):
    a, b = VC.ChoiceCache(IDENT), VC.ChoiceCache(IDENT)
    assert a.put(P(5), VC.Choice("cublas", how="raced", measured_m=5))
    assert b.put(P(100), VC.Choice("torch", how="raced", measured_m=100))  # b read before a wrote: merged
    both = VC.ChoiceCache(IDENT)
    assert both.get(P(5)).kind == "cublas" and both.get(P(100)).kind == "torch"
    ro = VC.ChoiceCache(IDENT, root=tmp_path / "missing" / "dir")
    assert ro.put(P(5), VC.Choice("torch")) is False and ro.get(P(5)).kind == "torch"  # serves this process


# -- the dispatcher ------------------------------------------------------------------------------------------
N, K = 40, 24


@pytest.fixture
def fake_gpu(monkeypatch):
    """``dispatch._build`` on a device of type cuda whose plans are CPU stand-ins; returns (build, race log, plans
    made)."""
    raced, made = [], []
    times = {"torch": 0.03, "cublas": 0.02, "cublaslt#0 algo=1": 0.015, "cublaslt#1 algo=9": 0.01}

    def plans_for(problem, bufs, include=""):
        raced.append(problem.M)
        drawn.append(id(bufs))
        return _plans(times, {})

    drawn = []  # the operands each race timed on

    def buffers(problem, device, seed=0, on_device=False):
        host.append(not on_device)
        return make_buffers(problem, "cpu", seed)

    host = []  # whether each draw was made on the host

    def vendor_plan(kind, algo, problem, bufs):
        made.append((kind, algo, problem.M))
        return launchers.Launch(launchers.torch_mm, None, (), f" [{kind} stand-in]")

    monkeypatch.setattr(dispatch, "_identity", lambda device: ("NVIDIA H200", {"torch": torch.__version__}))
    monkeypatch.setattr(dispatch, "make_buffers", buffers)
    monkeypatch.setattr(dispatch, "_choice_cache", lambda device, gpu: VC.ChoiceCache(IDENT))
    monkeypatch.setattr(VC, "plans_for", plans_for)
    monkeypatch.setattr(VC, "event_timer", _timer(times))
    monkeypatch.setattr(VC, "cold_timer", _timer(times))
    fresh = []  # the layouts the graph races' fresh-input timers were made for
    monkeypatch.setattr(VC, "fresh_timer", lambda bufs, layout, seed=1: (fresh.append(layout), VC.event_timer)[1])
    monkeypatch.setenv(VC.RACE_MS_ENV, "0.001")  # the minimum rounds only
    monkeypatch.setattr(launchers, "vendor_plan", vendor_plan)
    dev = types.SimpleNamespace(type="cuda", index=0)
    dispatch.use_library(Library())

    def build(M):
        return dispatch._build(M, N, K, torch.float16, "tn", dev)

    build.drawn, build.host, build.fresh = drawn, host, fresh
    yield build, raced, made
    dispatch.use_library(Library())


def test_a_shape_with_no_entry_is_served_by_the_raced_vendor_plan(fake_gpu):
    build, raced, made = fake_gpu
    s = build(37)
    assert s.eager_desc == s.graph_desc == "vendor: cuBLASLt algo=9 [raced at M=37] [cublaslt stand-in]"
    assert raced == [37, 37] and made == [("cublaslt", "algo=9", 37)] * 2  # the eager and the graph race
    assert len(build.drawn) == 2 and len(set(build.drawn)) == 1  # both races time one set of operands,
    assert build.host == [False]  # drawn once, on the device
    assert build.fresh == ["tn"]  # the graph race refills the operands its layout reads before each call
    assert build(50).eager_desc.startswith("vendor: cuBLASLt algo=9 [raced at M=37]") and raced == [37, 37]
    build(64)
    assert raced == [37, 37, 64, 64]


def test_eager_calls_are_served_by_the_cold_race_and_graphs_by_the_warm_one(fake_gpu, monkeypatch):
    build, raced, made = fake_gpu
    cold = {"torch": 0.03, "cublas": 0.009, "cublaslt#0 algo=1": 0.015, "cublaslt#1 algo=9": 0.0095}
    monkeypatch.setattr(VC, "cold_timer", _timer(cold))
    s = build(37)
    assert s.graph_desc == "vendor: cuBLASLt algo=9 [raced at M=37] [cublaslt stand-in]"
    assert s.eager_desc == "vendor: cublasGemmEx [raced at M=37] [cublas stand-in]"
    keys = set(VC.ChoiceCache(IDENT).choices)  # both recorded, under keys of their own
    assert keys == {VC.choice_key(GemmProblem(37, N, K, "fp16", "fp32", "tn"), protocol=p) for p in VC.PROTOCOLS}
    raced.clear()
    dispatch.reset()
    dispatch.use_library(Library())
    again = build(40)  # another process: both read back, no race
    assert raced == [] and (again.eager_desc, again.graph_desc) == (s.eager_desc, s.graph_desc)


def test_graph_race_cold_serves_graph_replays_from_the_one_cold_race(fake_gpu, monkeypatch):
    build, raced, made = fake_gpu
    cold = {"torch": 0.03, "cublas": 0.009, "cublaslt#0 algo=1": 0.015, "cublaslt#1 algo=9": 0.0095}
    monkeypatch.setattr(VC, "cold_timer", _timer(cold))
    monkeypatch.setenv(VC.GRAPH_RACE_ENV, "cold")
    s = build(37)
    assert s.graph_desc == s.eager_desc == "vendor: cublasGemmEx [raced at M=37] [cublas stand-in]"
    assert raced == [37]  # one race, in the cold protocol, serves both
    assert set(VC.ChoiceCache(IDENT).choices) == {
        VC.choice_key(GemmProblem(37, N, K, "fp16", "fp32", "tn"), protocol="cold")}


@pytest.mark.parametrize("value", ["hot", "graph", "1"])
def test_a_bad_graph_race_setting_is_a_one_line_error(fake_gpu, monkeypatch, value):
    build, raced, _ = fake_gpu
    monkeypatch.setenv(VC.GRAPH_RACE_ENV, value)
    with pytest.raises(dispatch.DispatchError, match=f"GEMMRL_GRAPH_RACE='{value}': use 'warm'"):
        build(37)
    assert raced == []


def test_the_protocol_is_part_of_the_key_and_graphs_keep_their_old_keys():
    assert VC.choice_key(P(5), protocol="cold") == VC.choice_key(P(5)) + "|cold+host+eager"
    assert VC.choice_key(P(5), ("triton:x",), "cold").endswith("|cold+host+eager") and "|gen=" in VC.choice_key(P(5), ("x",))
    assert VC.choice_key(P(5), protocol="graph") == "fp16|tn|N=4096|K=4096|M=4-7"  # as caches written before hold
    cache = VC.ChoiceCache(IDENT)
    cache.put(P(5), VC.Choice("cublas", how="raced", measured_m=5), protocol="cold")
    assert cache.get(P(6)) is None and VC.ChoiceCache(IDENT).get(P(6), protocol="cold").kind == "cublas"
    with pytest.raises(VC.VendorChoiceError, match="graph or cold"):
        VC.choice_key(P(5), protocol="offline")


def test_plans_in_turn_are_the_choice_its_races_next_fastest_then_the_defaults():
    times = (("cublaslt#1 algo=9", 10.0), ("cublaslt#0 algo=1", 15.0), ("gen#triton:cfg", 5.0), ("cublas", 20.0),
             ("cublaslt#7 algo=4", 12.0), ("cublaslt#5 algo=6", 13.0))
    c = VC.Choice("cublaslt", "algo=9", "raced", 37, times)
    got = [(x.kind, x.algo) for x in VC.in_turn(c, most=2)]
    assert got == [("cublaslt", "algo=9"), ("cublaslt", "algo=4"), ("cublaslt", "algo=6"), ("torch", ""),
                   ("cublas", ""), ("cublaslt", "")]  # a generated kernel is no vendor plan; the defaults last
    assert all(x.measured_m == 37 and x.times_us == times for x in VC.in_turn(c))
    assert [(x.kind, x.algo) for x in VC.in_turn(VC.Choice("cublas"))] == [("cublas", ""), ("torch", ""),
                                                                           ("cublaslt", "")]


@pytest.mark.parametrize("algo, built, want", [("id=66 tile=64x8 splitk=16 reduction=COMPUTE_TYPE", False, True),
                                               ("id=66 tile=64x8 splitk=1 reduction=NONE", False, False),
                                               ("id=66 tile=64x8 splitk=1 reduction=NONE", True, True),
                                               ("", False, False)])
def test_split_k_and_unlisted_configurations_pass_the_battery_before_they_serve(algo, built, want):
    assert VC.checks_battery(VC.Choice("cublaslt", algo), built) is want
    assert not VC.checks_battery(VC.Choice("cublas", algo), built)


def test_a_raced_plan_that_does_not_compute_right_hands_over_to_the_next(fake_gpu, monkeypatch):
    """The race's winner (algo=9) writes a wrong product and the next fastest (algo=1, split K) fails the battery:
    cublasGemmEx, the next, serves, is recorded for the bucket in place of the winner and a warning says why."""
    build, raced, made = fake_gpu
    times = {"torch": 0.03, "cublas": 0.02, "cublaslt#0 id=1 splitk=2": 0.015, "cublaslt#1 algo=9": 0.01}
    monkeypatch.setattr(VC, "event_timer", _timer(times))
    monkeypatch.setattr(VC, "cold_timer", _timer(times))
    monkeypatch.setattr(VC, "plans_for", lambda problem, bufs, include="": (raced.append(problem.M),
                                                                           _plans(times, {}))[1])
    tried = []

    def vendor_plan(kind, algo, problem, bufs):
        tried.append((kind, algo))
        if algo == "algo=9":
            return launchers.Launch(lambda a, b, out: out.zero_(), "wrong", (), " [stand-in]")
        return launchers.Launch(launchers.torch_mm, algo or kind, (), f" [{kind} stand-in]")
    monkeypatch.setattr(launchers, "vendor_plan", vendor_plan)
    checked = []

    def battery(cand, problem, where):
        checked.append(cand)
        return types.SimpleNamespace(passed=cand != "id=1 splitk=2", reason="error 1.43x the correctly rounded")
    monkeypatch.setattr(dispatch, "verify", battery)
    with pytest.warns(RuntimeWarning, match=r"algo=9 \[raced at M=37\] \(RuntimeError: max error.*id=1 splitk=2.*"
                                            r"battery.*cublasGemmEx \[raced at M=37\] serves instead"):
        s = build(37)
    assert s.eager_desc == s.graph_desc == "vendor: cublasGemmEx [raced at M=37] [cublas stand-in]"
    assert tried[:3] == [("cublaslt", "algo=9"), ("cublaslt", "id=1 splitk=2"), ("cublas", "")]
    assert checked[0] == "id=1 splitk=2" and "cublas" not in checked  # the battery for the split-K plan alone
    for protocol in VC.PROTOCOLS:  # recorded: the next process serves it without trying the others
        got = VC.ChoiceCache(IDENT).get(GemmProblem(37, N, K, "fp16", "fp32", "tn"), protocol=protocol)
        assert got.kind == "cublas"


def test_a_plan_that_passed_the_battery_at_a_shape_skips_it_in_the_next_process(fake_gpu, monkeypatch):
    """A split-K plan passes the battery before it serves; the pass is recorded with the choices (per identity and
    exact shape), so the next process serves it without running the battery again; another M runs it."""
    build, raced, made = fake_gpu
    times = {"torch": 0.03, "cublas": 0.02, "cublaslt#0 algo=1": 0.015, "cublaslt#1 id=1 splitk=2": 0.01}
    monkeypatch.setattr(VC, "event_timer", _timer(times))
    monkeypatch.setattr(VC, "cold_timer", _timer(times))
    monkeypatch.setattr(VC, "plans_for", lambda problem, bufs, include="": _plans(times, {}))
    checked = []

    def battery(cand, problem, where):
        checked.append(problem.M)
        return types.SimpleNamespace(passed=True, reason="")
    monkeypatch.setattr(dispatch, "verify", battery)
    s = build(37)
    assert "id=1 splitk=2" in s.eager_desc and "id=1 splitk=2" in s.graph_desc
    assert checked == [37]  # graph and cold chose the same plan: one battery for the shape
    cache = VC.ChoiceCache(IDENT)
    assert cache.has_passed(GemmProblem(37, N, K, "fp16", "fp32", "tn"), VC.Choice("cublaslt", "id=1 splitk=2"))
    assert not cache.has_passed(GemmProblem(38, N, K, "fp16", "fp32", "tn"), VC.Choice("cublaslt", "id=1 splitk=2"))
    build(37)  # the next process: the recorded pass, no battery
    assert checked == [37]
    build(38)  # another M of the bucket: the bucket's plan, checked at its own shape
    assert checked == [37, 38]


def test_off_serves_torch_matmul_and_heuristic_the_first_plan(fake_gpu, monkeypatch):
    build, raced, made = fake_gpu
    monkeypatch.setenv(VC.MODE_ENV, "off")
    assert build(5).eager_desc == "torch.matmul" and raced == [] and made == []
    monkeypatch.setenv(VC.MODE_ENV, "heuristic")
    assert build(5).eager_desc.startswith("vendor: cuBLASLt (the heuristic's first) [heuristic]") and raced == []


def test_nothing_is_raced_inside_capture(fake_gpu, monkeypatch):
    _, raced, _ = fake_gpu
    monkeypatch.setattr(dispatch, "_capturing", lambda: True)
    a, b = torch.randn(9, K).half(), torch.randn(N, K).half().t()
    key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, 0, 0)
    s = dispatch._miss(key, types.SimpleNamespace(  # an a that says it is on CUDA device 0
        dtype=a.dtype, device=a.device, dim=a.dim, shape=a.shape, numel=a.numel, get_device=lambda: 0,
        is_contiguous=a.is_contiguous), b)
    assert s.eager_desc == "torch.matmul" and raced == []  # served by torch now, built at the next eager call


def _capture_call(M, layout="tn"):
    """dispatch._miss inside a capture for an a that says it is on CUDA device 0."""
    a = torch.randn(M, K).half()
    b = torch.randn(N, K).half().t() if layout == "tn" else torch.randn(K, N).half()
    key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, 0, 0)
    fake_a = types.SimpleNamespace(dtype=a.dtype, device=a.device, dim=a.dim, shape=a.shape, numel=a.numel,
                                   get_device=lambda: 0, is_contiguous=a.is_contiguous, reshape=a.reshape)
    return dispatch._miss(key, fake_a, b)


@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_a_shape_first_seen_inside_capture_takes_its_buckets_cached_choice(fake_gpu, monkeypatch, layout):
    build, raced, made = fake_gpu
    dev = types.SimpleNamespace(type="cuda", index=0)
    dispatch._build(37, N, K, torch.float16, layout, dev)  # raced eagerly: the bucket 32..63 is cached
    assert raced == [37, 37]  # in graph and in cold
    monkeypatch.setattr(dispatch, "_capturing", lambda: True)
    s = _capture_call(50, layout)
    assert s.graph_desc == ("vendor: cuBLASLt algo=9 [raced at M=37] [cublaslt stand-in] (cached choice, first seen "
                            "inside capture)")
    assert raced == [37, 37] and made[-1] == ("cublaslt", "algo=9", 50)
    assert _capture_call(9, layout).graph_desc == "torch.matmul" and raced == [37, 37]  # 8..15: nothing cached
    n = len(made)
    _capture_call(50, layout)
    assert len(made) == n  # one plan per shape for the whole capture
    monkeypatch.setattr(dispatch, "_capturing", lambda: False)
    assert dispatch._build(50, N, K, torch.float16, layout, dev).graph_desc.startswith("vendor: cuBLASLt algo=9")


def test_inside_capture_a_generated_winner_gives_its_races_vendor_plan(fake_gen, monkeypatch):
    build, raced, made, times, launched, _ = fake_gen
    dispatch.use_library(Library([_entry(16, CFG_A)]))
    times[f"gen#triton:{CFG_A}"] = 0.001
    assert build(20).graph_desc.startswith(f"triton:{CFG_A} [raced at M=20")
    launched.clear()
    monkeypatch.setattr(dispatch, "_capturing", lambda: True)
    s = _capture_call(30)
    assert s.graph_desc.startswith("vendor: cuBLASLt algo=9 [raced at M=20]") and launched == []


# -- generated kernels in the race --------------------------------------------------------------------------
def test_a_generated_winner_keeps_the_fastest_vendor_plan_beside_it():
    times = {"torch": 0.030, "cublas": 0.020, "cublaslt#0 algo=1": 0.018, "gen#triton:cfgA": 0.012,
             "gen#triton:cfgB": 0.016}
    cache = VC.ChoiceCache(IDENT)
    names = ("triton:cfgA", "triton:cfgB")
    c = VC.choose(P(40), cache, lambda: _plans(times, {}), timer=_timer(times), budget_s=0.0, generated=names)
    assert (c.kind, c.algo, c.fallback, c.measured_m) == ("gen", "triton:cfgA", "cublaslt#0 algo=1", 40)
    assert c.describe() == "triton:cfgA [raced at M=40]"
    assert c.vendor().kind == "cublaslt" and c.vendor().algo == "algo=1"
    again = VC.ChoiceCache(IDENT)  # read back from the file
    assert again.get(P(33), names) == c and again.get(P(33)) is None  # another contender set is another key
    assert again.get(P(33), ("triton:cfgA",)) is None


@pytest.mark.parametrize("name, plan", [("torch", ("torch", "")), ("cublas", ("cublas", "")),
                                        ("cublaslt#3 algo=7 tile=2", ("cublaslt", "algo=7 tile=2")),
                                        ("gen#triton:tiled(BM=64)", ("gen", "triton:tiled(BM=64)"))])
def test_race_names_parse_back_to_plans(name, plan):
    assert VC.plan_of(name) == plan


def test_a_cache_written_before_generated_contenders_still_reads(tmp_path):
    VC.ChoiceCache(IDENT).put(P(5), VC.Choice("cublas", how="raced", measured_m=5))
    raw = json.loads(VC.ChoiceCache(IDENT).path.read_text())
    for v in raw["choices"].values():
        v.pop("fallback")  # as a file from before the field existed
    VC.ChoiceCache(IDENT).path.write_text(json.dumps(raw))
    assert VC.ChoiceCache(IDENT).get(P(6)).kind == "cublas"


def _entry(M, impl, *, members=None, relabelled=False, protocol="graph", fam="triton", m_lo=None, m_hi=None):
    from gemmrl.library import AS_GPU_SOURCE, Entry
    return Entry(gpu="NVIDIA H200", cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol=protocol, M=M, N=N,
                 K=K, family=fam, impl=impl, algo=impl, time_ms=0.01, vendor_best_ms=0.012,
                 vendor_best="cublas_tn", m_lo=m_lo or M, m_hi=m_hi or M, members=members or (f"{M}_{N}_{K}",),
                 verified=True, source=AS_GPU_SOURCE + "NVIDIA H100 80GB HBM3" if relabelled else "")


CFG_A = "tiled(BM=64,BN=64,BK=32,warps=4,stages=3,group_m=8)"
CFG_B = "tiled(BM=128,BN=64,BK=32,warps=4,stages=3,group_m=8)"
CFG_C = "tiled(BM=32,BN=64,BK=32,warps=4,stages=3,group_m=8)"


@pytest.fixture
def fake_gen(fake_gpu, monkeypatch):
    """fake_gpu with generated contenders: their stand-in calls are named gen#<family>:<impl> for the timer, the
    battery's verdict per impl is set by the test; returns (build, raced, made, times, launched, verdicts)."""
    build, raced, made = fake_gpu
    times = {"torch": 0.03, "cublas": 0.02, "cublaslt#0 algo=1": 0.015, "cublaslt#1 algo=9": 0.01}
    launched, verdicts = [], {}

    def plans_for(problem, bufs, include=""):  # the vendor plans: a generated contender races once built
        raced.append(problem.M)
        return _plans({k: v for k, v in times.items() if not k.startswith(VC.GEN)}, {})

    def launch(e, problem, bufs):
        launched.append((e.impl, problem.M))

        def call(a, b, out):
            return 1
        call.__name__ = f"gen#{e.family}:{e.impl}"
        return launchers.Launch(call, e.impl, (), "")

    def timer(fn):
        name = fn.func.__name__ if hasattr(fn, "func") else fn.__name__
        return times[name] * (1.0 + 0.001 * (fn() or 0))

    def fake_verify(cand, problem, where):
        ok = verdicts.get(cand, True)
        return types.SimpleNamespace(passed=ok, reason="" if ok else "wrong tail tile")

    monkeypatch.setattr(VC, "plans_for", plans_for)
    monkeypatch.setattr(VC, "event_timer", timer)
    monkeypatch.setattr(VC, "cold_timer", timer)
    monkeypatch.setattr(launchers, "launch", launch)
    monkeypatch.setattr(dispatch, "verify", fake_verify)
    monkeypatch.setattr(dispatch, "_reference_check", lambda fn, bufs, problem: None)  # stand-ins compute nothing
    return build, raced, made, times, launched, verdicts


def test_an_m_between_tuned_shapes_races_the_neighbours_and_serves_the_faster_generated_one(fake_gen):
    build, raced, made, times, launched, _ = fake_gen
    dispatch.use_library(Library([_entry(16, CFG_A), _entry(64, CFG_B), _entry(256, CFG_C)]))
    times.update({f"gen#triton:{CFG_A}": 0.012, f"gen#triton:{CFG_B}": 0.008})
    s = build(37)
    assert s.graph_desc.startswith(f"triton:{CFG_B} [raced at M=37 against the vendor plans; graph entry 64_40_24")
    assert s.eager_desc == s.graph_desc and raced == [37, 37]  # raced in graph and in cold
    assert sorted(i for i, _ in launched) == sorted([CFG_A, CFG_B] * 2)  # the neighbours at M=16 and 64, not 256
    assert made == []  # no vendor plan was made: the generated kernel serves
    build(40)  # the bucket's choice: no second race
    assert raced == [37, 37]


def test_a_vendor_plan_faster_than_every_neighbour_serves(fake_gen):
    build, raced, made, times, launched, _ = fake_gen
    dispatch.use_library(Library([_entry(16, CFG_A), _entry(64, CFG_B)]))
    times.update({f"gen#triton:{CFG_A}": 0.02, f"gen#triton:{CFG_B}": 0.03})
    assert build(37).graph_desc.startswith("vendor: cuBLASLt algo=9 [raced at M=37]")


def test_a_generated_winner_that_fails_the_battery_gives_way_to_the_fastest_vendor_plan(fake_gen):
    build, raced, made, times, launched, verdicts = fake_gen
    dispatch.use_library(Library([_entry(16, CFG_A)]))
    times[f"gen#triton:{CFG_A}"] = 0.001
    verdicts[CFG_A] = False
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        s = build(20)
    assert s.graph_desc.startswith("vendor: cuBLASLt algo=9") and made[-1][:2] == ("cublaslt", "algo=9")
    assert any("wrong tail tile" in str(x.message) for x in w)
    dispatch.reset()
    dispatch.use_library(Library([_entry(16, CFG_A)]))
    launched.clear()
    raced.clear()
    assert build(21).graph_desc.startswith("vendor: cuBLASLt algo=9") and raced == []  # recorded: no new race
    assert launched == []


def test_an_entry_measured_here_is_served_without_a_race_and_a_relabelled_one_races(fake_gen):
    build, raced, made, times, launched, _ = fake_gen
    dispatch.use_library(Library([_entry(16, CFG_A), _entry(32, CFG_B, relabelled=True)]))
    times.update({f"gen#triton:{CFG_A}": 0.02, f"gen#triton:{CFG_B}": 0.005})
    at16 = build(16)
    assert at16.graph_desc.startswith(f"triton:{CFG_A} (graph entry 16_40_24") and raced == []
    at32 = build(32)
    assert raced == [32, 32] and at32.graph_desc.startswith(f"triton:{CFG_B} [raced at M=32 against the vendor plans; "
                                                       "graph entry 32_40_24, relabelled]")


def test_a_relabelled_vendor_entry_is_not_a_contender_the_race_times_the_vendor_plans_here(fake_gen):
    build, raced, made, times, launched, _ = fake_gen
    dispatch.use_library(Library([_entry(48, "cublaslt_autotuned_tn", fam="vendor", relabelled=True)]))
    s = build(48)
    assert raced == [48, 48] and launched == [] and s.graph_desc.startswith("vendor: cuBLASLt algo=9 [raced at M=48]")


def test_neighbours_are_the_nearest_tuned_m_below_and_above():
    lib = Library([_entry(16, CFG_A), _entry(64, CFG_B, protocol="cold"), _entry(64, CFG_C), _entry(256, CFG_A),
                   _entry(1, "cublas_tn", fam="vendor"),
                   _entry(1024, CFG_C, members=(f"1024_{N}_{K}", f"4096_{N}_{K}"), m_lo=1024, m_hi=4096)])
    nb = lambda M: [(e.M, e.impl) for e in lib.neighbours("NVIDIA H200", "fp16", "fp32", "tn", M, N, K)]  # noqa: E731
    assert {i for _, i in nb(37)} == {CFG_A, CFG_B, CFG_C} and nb(37)[0][1] in (CFG_B, CFG_C)  # 64 is nearer
    assert nb(16) == [(16, CFG_A)]
    assert nb(1) == [(16, CFG_A)]  # the vendor entry at 1 is not a contender
    assert {i for _, i in nb(2000)} == {CFG_C}  # the bucket counts at 1024 and at 4096
    assert {i for _, i in nb(9000)} == {CFG_C}
    assert lib.neighbours("NVIDIA H200", "fp16", "fp32", "tn", 37, N, K + 1) == []


SMALLM = "smallm(BM=1,BN=16,BK=16,warps=1,stages=1,split=1,reduction=none,tma=False,mma=False)"


@pytest.mark.parametrize("M, expect", [(1, {SMALLM}), (2, {CFG_C}), (63, {CFG_C}), (3531, {CFG_C})])
def test_a_neighbour_its_family_refuses_at_this_m_is_no_contender(M, expect):
    lib = Library([_entry(1, SMALLM), _entry(256, CFG_C)])  # this smallm config (one row per tile) serves M = 1 only
    got = dispatch._contenders(lib, "NVIDIA H200", GemmProblem(M, N, K, "fp16", "fp32", "tn"))
    assert {e.impl for e in got} == expect


@pytest.mark.parametrize("per_call_us, batch_us, calls", [
    (4.0, 200.0, 50), (0.5, 200.0, 128), (20.0, 200.0, 10), (40.0, 200.0, 8),  # short calls: at least 8
    (60.0, 200.0, 4), (250.0, 200.0, 1), (8000.0, 1000.0, 1), (120.0, 1000.0, 9)])
def test_a_sample_holds_calls_for_its_batch_and_a_long_call_needs_no_company(per_call_us, batch_us, calls):
    assert VC.batch_calls(per_call_us, batch_us) == calls


@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_the_reference_check_reads_b_in_slices_and_catches_a_wrong_column_or_nan(monkeypatch, layout):
    monkeypatch.setattr(dispatch, "REFERENCE_CHUNK", 64 * 8)  # 8 columns per slice at K = 64: 5 slices at N = 40
    p = GemmProblem(7, 40, 64, "fp16", "fp32", layout)
    bufs = make_buffers(p, "cpu", seed=2)

    def right(a, b, out):
        out.copy_((a.float() @ b.float()).half())

    dispatch._reference_check(right, bufs, p)

    def wrong_last_slice(a, b, out):
        right(a, b, out)
        out[3, 37] += 0.5

    with pytest.raises(RuntimeError, match="against an fp32 reference"):
        dispatch._reference_check(wrong_last_slice, bufs, p)

    def unwritten(a, b, out):
        right(a, b, out)
        out[0, 20] = float("nan")

    with pytest.raises(RuntimeError, match="max error nan"):
        dispatch._reference_check(unwritten, bufs, p)


@pytest.mark.parametrize("layout", ["tn", "nn"])
def test_the_reference_check_reads_the_form_of_b_the_call_reads(layout):
    """After the graph race the form of B it refilled holds other numbers than the other form: the check's product
    reads the form the call reads (on an H200 every tn shape failed it against the stale nn form and fell back to
    torch.matmul)."""
    p = GemmProblem(5, 24, 32, "fp16", "fp32", layout)
    bufs = make_buffers(p, "cpu", seed=4)
    (bufs.bt if layout == "tn" else bufs.b).normal_(0.0, 32 ** -0.25)  # refilled: the forms no longer agree

    def right(a, b, out):
        out.copy_((a.float() @ b.float()).half())

    dispatch._reference_check(right, bufs, p)


TILE_A, TILE_B, TILE_C = "id=66 tile=128x256 splitk=1", "id=66 tile=256x152 splitk=1", "id=66 tile=64x64 splitk=1"


def test_another_large_m_of_a_bucket_confirms_its_plan_at_its_own_m():
    """From CONFIRM_M rows up a bucket's vendor plan is raced again at another M against the three defaults alone
    (a tile's wave count changes inside the bucket), and the winner is kept for that M."""
    cache = VC.ChoiceCache(IDENT)
    at6137 = {"torch": 0.30, "cublas": 0.29, f"cublaslt#0 {TILE_A}": 0.28, f"cublaslt#1 {TILE_B}": 0.26}
    c = VC.choose(P(6137), cache, lambda: _plans(at6137, {}), timer=_timer(at6137), budget_s=0)
    assert (c.algo, c.measured_m) == (TILE_B, 6137)
    # at 5401 this M's list holds the bucket's tile at another index, its wave count elsewhere; it is slower there
    at5401 = {"torch": 0.26, "cublas": 0.255, f"cublaslt#0 {TILE_A}": 0.249, f"cublaslt#2 {TILE_C}": 0.2,
              f"cublaslt#3 {TILE_B} waves=4.970": 0.273}
    built = []

    def plans():
        built.append(5401)
        return _plans(at5401, {})
    c2 = VC.choose(P(5401), cache, plans, timer=_timer(at5401), budget_s=0)
    assert (c2.kind, c2.algo, c2.measured_m) == ("cublaslt", TILE_A, 5401)
    assert {k for k, _ in c2.times_us} == {"torch", "cublas", f"cublaslt#0 {TILE_A}", f"cublaslt#3 {TILE_B} waves=4.970"}
    assert VC.choose(P(5401), cache, plans, timer=_timer(at5401), budget_s=0) == c2 and built == [5401]  # kept
    assert cache.get(P(6137)) == c and cache.get(P(7000)) == c  # the bucket's choice is unchanged
    again = VC.ChoiceCache(IDENT)  # and both are in the file
    assert again.get(P(5401)) == c2 and again.get(P(4096)) == c


def test_small_ms_generated_winners_and_plans_missing_here_are_not_confirmed():
    cache = VC.ChoiceCache(IDENT)
    at37 = {"torch": 0.03, "cublas": 0.02, f"cublaslt#0 {TILE_A}": 0.015, f"cublaslt#1 {TILE_B}": 0.01}
    c = VC.choose(P(37), cache, lambda: _plans(at37, {}), timer=_timer(at37), budget_s=0)
    nothing = lambda: pytest.fail("no race expected")  # noqa: E731
    assert VC.choose(P(50), cache, nothing, timer=_timer(at37), budget_s=0) == c  # below CONFIRM_M
    gen = VC.Choice("gen", "triton:cfg", "raced", 3000, (), "cublas")
    assert not VC.confirms(gen, P(2500)) and VC.confirms(dataclasses.replace(gen, kind="cublas"), P(2500))
    cache.put(P(3000), VC.Choice("cublaslt", TILE_B, "raced", 3000, ()))
    at2500 = {"torch": 0.1, "cublas": 0.1, f"cublaslt#0 {TILE_A}": 0.1}  # the bucket's tile is not listed here
    assert VC.choose(P(2500), cache, lambda: _plans(at2500, {}), timer=_timer(at2500), budget_s=0).measured_m == 3000


def test_a_bucket_plan_missing_from_another_ms_list_is_built_there_and_raced():
    """The bucket's cuBLASLt configuration is not among this M's listed plans (a split-K factor offered at the
    bucket's M, not here): the confirm asks for it by description, races it against the defaults and keeps the
    winner for this M."""
    cache = VC.ChoiceCache(IDENT)
    cache.put(P(3000), VC.Choice("cublaslt", TILE_B, "raced", 3000, ()))
    at2500 = {"torch": 0.1, "cublas": 0.1, f"cublaslt#0 {TILE_A}": 0.1, f"cublaslt#40 {TILE_B} waves=0.9": 0.08}
    asked = []

    def vendor_plans(desc):
        asked.append(desc)
        return _plans({k: v for k, v in at2500.items() if desc or "#40" not in k}, {})
    c = VC.choose(P(2500), cache, lambda: pytest.fail("the confirm builds the vendor plans alone"),
                  timer=_timer(at2500), budget_s=0, vendor_plans=vendor_plans)
    assert asked == [TILE_B] and (c.algo, c.measured_m) == (f"{TILE_B} waves=0.9", 2500)
    assert {k for k, _ in c.times_us} == set(at2500)
    assert VC.ChoiceCache(IDENT).get(P(2500)) == c and VC.ChoiceCache(IDENT).get(P(3000)).measured_m == 3000


H200_ARCH = Arch(name="NVIDIA H200", cc=90, num_sms=132, smem_per_block=232448, smem_per_sm=233472, hbm_tbps=4.8)


@pytest.fixture
def table_tiles(fake_gen, monkeypatch):
    """fake_gen on a GPU where the launch-bound table races (N, K = 40, 24 is launch-bound): its tiles' names."""
    monkeypatch.setattr(launch_bound, "arch_here", lambda: H200_ARCH)
    monkeypatch.delenv(launch_bound.ENV, raising=False)
    tiles = [e.impl for e in launch_bound.contenders(GemmProblem(37, N, K, "fp16", "fp32", "tn"), "NVIDIA H200",
                                                     H200_ARCH)]
    assert len(tiles) == launch_bound.COUNT
    return fake_gen, tiles


def test_a_launch_bound_shape_with_no_entry_races_the_table_and_a_faster_tile_serves_after_the_battery(table_tiles):
    (build, raced, made, times, launched, verdicts), tiles = table_tiles
    times.update({f"gen#triton:{t}": 0.02 for t in tiles})
    times[f"gen#triton:{tiles[1]}"] = 0.005  # faster than every vendor plan (the best is 0.01)
    s = build(37)
    assert s.graph_desc.startswith(f"triton:{tiles[1]} [raced at M=37 against the vendor plans; graph entry 37_40_24")
    assert sorted(i for i, _ in launched) == sorted(tiles * 2)  # every tile raced, in graph and in cold
    assert made == []


def test_a_table_tile_that_fails_the_battery_or_loses_leaves_the_vendor_plan(table_tiles):
    (build, raced, made, times, launched, verdicts), tiles = table_tiles
    times.update({f"gen#triton:{t}": 0.02 for t in tiles})
    times[f"gen#triton:{tiles[0]}"] = 0.001
    verdicts[tiles[0]] = False
    with pytest.warns(RuntimeWarning, match="failed the correctness battery: wrong tail tile"):
        assert build(37).graph_desc.startswith("vendor: cuBLASLt algo=9 [raced at M=37]")


def test_the_table_is_left_out_when_switched_off_and_a_bad_switch_says_what_to_set(table_tiles, monkeypatch):
    (build, raced, made, times, launched, verdicts), tiles = table_tiles
    monkeypatch.setenv(launch_bound.ENV, "0")
    assert build(37).graph_desc.startswith("vendor: cuBLASLt algo=9 [raced at M=37]") and launched == []
    monkeypatch.setenv(launch_bound.ENV, "on")
    with pytest.raises(dispatch.DispatchError, match="GEMMRL_LAUNCH_BOUND='on': use 1"):
        build(200)


def test_library_contenders_come_first_and_the_table_adds_its_tiles_once(table_tiles):
    _, tiles = table_tiles
    lib = Library([_entry(64, tiles[0]), _entry(16, CFG_A)])
    got = [e.impl for e in dispatch._contenders(lib, "NVIDIA H200", GemmProblem(37, N, K, "fp16", "fp32", "tn"))]
    assert got[:2] in ([tiles[0], CFG_A], [CFG_A, tiles[0]]) and got[2:] == tiles[1:]


def test_the_cold_race_issues_each_call_eagerly_after_its_flush(monkeypatch):
    """What serves eager calls is raced as eager calls run: each sample's (flush, call) pairs issued one by one on the
    stream (no graph: a split-K plan's second kernel pays the stream's launch gap), behind a device sleep, the eager
    flushes' time taken out; the graph race keeps its graphs."""
    assert VC.cold_timer.eager and VC.cold_timer.flushed and not VC.event_timer.eager
    monkeypatch.setattr(VC, "_capture", lambda *a, **k: pytest.fail("an eager timer captured a graph"))
    monkeypatch.setattr(VC, "_graph_of", lambda *a, **k: pytest.fail("an eager timer asked for a graph"))
    flushes, offs, leads = [], [], []
    monkeypatch.setattr(VC, "_flush_l2", lambda: flushes.append(1))
    monkeypatch.setattr(VC, "_flush_ms", lambda eager=False: (offs.append(eager), 0.002)[1])

    def elapsed(works, lead_us=0.0):
        leads.append(lead_us)
        out = []
        for w in works:
            before = len(calls)
            w()
            out.append(0.005 * (len(calls) - before) + 0.002 * (len(calls) - before))  # each call: 5 us + its flush
        return out

    monkeypatch.setattr(VC, "_elapsed_many", elapsed)
    calls = []

    def plan():
        calls.append(1)
    timer = VC.GraphTimer(100.0, flushed=True, eager=True)
    got = timer.many([plan])
    n = VC.batch_calls(7.0, 100.0)  # one call measured first (7 us with its flush): calls for 100 us of work
    assert len(calls) == 1 + n and len(flushes) == len(calls)  # every call after its own flush
    assert got == [pytest.approx(0.005)] and offs == [True] and leads == [VC.EAGER_LEAD_US] * 2
    timer.many([plan])
    assert len(calls) == 1 + 2 * n  # the sample size is measured once per plan


def test_a_decode_shape_with_no_entry_races_gemv_rows_beside_the_tiles_and_a_faster_row_serves(fake_gen, monkeypatch):
    build, raced, made, times, launched, verdicts = fake_gen
    from gemmrl.serve import gemv_rows

    monkeypatch.setattr(launch_bound, "arch_here", lambda: H200_ARCH)  # both tables ask the device here
    monkeypatch.delenv(gemv_rows.ENV, raising=False)
    p = GemmProblem(5, N, K, "fp16", "fp32", "tn")
    rows = [e.impl for e in gemv_rows.contenders(p, "NVIDIA H200", H200_ARCH)]
    tiles = [e.impl for e in launch_bound.contenders(p, "NVIDIA H200", H200_ARCH)]
    assert rows and tiles and not set(rows) & set(tiles)
    times.update({f"gen#triton:{t}": 0.02 for t in rows + tiles})
    times[f"gen#triton:{rows[0]}"] = 0.004
    s = build(5)
    assert s.graph_desc.startswith(f"triton:{rows[0]} [raced at M=5 against the vendor plans")
    assert sorted(i for i, _ in launched) == sorted((rows + tiles) * 2)
    monkeypatch.setenv(gemv_rows.ENV, "0")
    launched.clear()
    build(6)  # M = 6 shares 5's bucket, but without the rows the contenders differ: raced again, tiles only
    assert launched and {i for i, _ in launched} == set(tiles)
    monkeypatch.setenv(gemv_rows.ENV, "maybe")
    with pytest.raises(dispatch.DispatchError, match="GEMMRL_GEMV_ROWS='maybe': use 1"):
        build(3)


# -- a first call's build budget ----------------------------------------------------------------------------
@pytest.fixture
def slow_builds(fake_gen, monkeypatch):
    """fake_gen whose contender builds each take one second of a stand-in clock."""
    build, raced, made, times, launched, verdicts = fake_gen
    now = [0.0]
    real = launchers.launch

    def launch(e, problem, bufs):
        now[0] += 1.0
        return real(e, problem, bufs)

    monkeypatch.setattr(dispatch, "_clock", lambda: now[0])
    monkeypatch.setattr(launchers, "launch", launch)
    dispatch.use_library(Library([_entry(16, CFG_A), _entry(64, CFG_B)]))
    times.update({f"gen#triton:{CFG_A}": 0.012, f"gen#triton:{CFG_B}": 0.008})
    return build, raced, launched, times


@pytest.mark.parametrize("budget, n_built", [("0", 0), ("0.5", 1), ("1.5", 2), ("inf", 2)])
def test_a_first_call_builds_contenders_within_its_budget_and_keys_its_choice_by_what_raced(
        slow_builds, monkeypatch, budget, n_built):
    """GEMMRL_FIRST_CALL_BUILD_S (each stand-in build takes 1 s): no build starts once the budget is spent (the one
    running may overrun it); the graph and the cold race leave out the same contenders; the choice is cached under
    those that raced, so a lookup naming them all misses (the next process races them all); served_by's text says
    what was left out."""
    build, raced, launched, times = slow_builds
    monkeypatch.setenv(dispatch.FIRST_CALL_BUILD_ENV, budget)
    s = build(37)
    names = {f"triton:{c}" for c in (CFG_A, CFG_B)}
    built = {f"triton:{i}" for i, _ in launched}
    assert len(built) == n_built and set(s.deferred) == names - built and raced == [37, 37]
    assert len(launched) == 2 * n_built  # built in the graph race, launched again in the cold race
    cache = VC.ChoiceCache(IDENT)
    for proto in ("graph", "cold"):
        assert cache.get(P(37, N, K), tuple(sorted(built)), proto) is not None
        assert (cache.get(P(37, N, K), tuple(sorted(names)), proto) is None) == bool(s.deferred)
    # CFG_B is the fastest plan: it serves where it raced
    assert s.graph_desc.startswith(f"triton:{CFG_B} [raced at M=37") == (f"triton:{CFG_B}" in built)
    if s.deferred:
        assert f"{len(s.deferred)} generated contender(s) not built within {dispatch.FIRST_CALL_BUILD_ENV}" in \
            s.graph_desc and s.graph_desc.endswith("gemmrl.warmup races them]")
    else:
        assert "not built within" not in s.graph_desc


def test_building_ahead_builds_every_contender_whatever_the_budget(slow_builds, monkeypatch):
    build, raced, launched, times = slow_builds
    monkeypatch.setenv(dispatch.FIRST_CALL_BUILD_ENV, "0")
    with dispatch.building_ahead():
        with dispatch.building_ahead():  # nested: still ahead
            assert dispatch.first_call_build_s() == math.inf
        s = build(37)
    assert dispatch.first_call_build_s() == 0.0  # the block ended
    assert s.deferred == () and s.graph_desc.startswith(f"triton:{CFG_B} [raced at M=37")
    assert sorted({i for i, _ in launched}) == sorted([CFG_A, CFG_B])


@pytest.mark.parametrize("raw, want", [("", dispatch.FIRST_CALL_BUILD_S), ("0", 0.0), (" 3.5 ", 3.5),
                                       ("inf", math.inf)])
def test_the_first_call_build_budget_setting(monkeypatch, raw, want):
    monkeypatch.setenv(dispatch.FIRST_CALL_BUILD_ENV, raw)
    assert dispatch.first_call_build_s() == want


@pytest.mark.parametrize("raw", ["-1", "two", "nan", "1s"])
def test_a_bad_first_call_build_budget_is_refused_saying_what_to_give(monkeypatch, raw):
    monkeypatch.setenv(dispatch.FIRST_CALL_BUILD_ENV, raw)
    with pytest.raises(dispatch.DispatchError, match=r"GEMMRL_FIRST_CALL_BUILD_S=.*a number >= 0 \(0: none, inf"):
        dispatch.first_call_build_s()


def test_warmup_builds_again_a_problem_whose_first_sight_left_contenders_out(monkeypatch):
    """A problem served after a capped first sight (Served.deferred) is built again by warmup, ahead of the calls;
    one built with every contender is kept as it is."""
    dispatch.use_library(Library())
    seen = []
    real = dispatch._build

    def spy(*a, **k):
        seen.append(dispatch.first_call_build_s())
        return real(*a, **k)

    monkeypatch.setattr(dispatch, "_build", spy)
    dispatch.warmup([(5, 7, 3)], layouts=("tn",))
    pkey = (5, 7, 3, torch.float16, "tn", -1)
    assert seen == [math.inf] and dispatch._S.built[pkey].deferred == ()
    dispatch.warmup([(5, 7, 3)], layouts=("tn",))
    assert seen == [math.inf]  # nothing left out: kept
    dispatch._S.built[pkey] = dataclasses.replace(dispatch._S.built[pkey], deferred=("triton:x",))
    a, b = torch.randn(5, 3).half(), torch.randn(7, 3).half().t()
    dispatch.mm(a, b)  # a signature served by the capped build
    dispatch.warmup([(5, 7, 3)], layouts=("tn",))
    assert seen == [math.inf, math.inf] and dispatch._S.built[pkey].deferred == ()
    assert dispatch._TABLE[(a.shape, b.shape, a.stride(), b.stride(), a.dtype, b.dtype, -1, -1)].deferred == ()
    out = dispatch.mm(a, b)
    assert torch.allclose(out.float(), a.float() @ b.float(), atol=1e-2)
