"""layout_choice: which layout gemmrl.mm serves faster here (CPU tier: Triton entries under the interpreter; the
timer is scripted where the answer must not depend on this machine's speed)."""

from __future__ import annotations

import math

import pytest
import torch

import gemmrl
from gemmrl.serve import dispatch
from gemmrl.candidate import make_buffers
from gemmrl.serve.bench_candidate import GemmrlCandidate
from gemmrl.serve.layout_choice import COLD_CALLS, TIE, LayoutChoice, choose, library_order, timed_in
from gemmrl.timing import REFILLED
from gemmrl.library import Entry, Library
from gemmrl.problem import GemmProblem

CFG = "tiled(BM=16,BN=16,BK=16,warps=1,stages=1,group_m=1)"
P = GemmProblem(5, 24, 16)


def entry(layout, t, protocol="offline", M=5, N=24, K=16):
    return Entry(gpu="cpu", cc="", dtype="fp16", acc="fp32", layout=layout, protocol=protocol, M=M, N=N, K=K,
                 family="triton", impl=CFG, algo="", time_ms=t, vendor_best_ms=2 * t, vendor_best="cublas_tn",
                 m_lo=M, m_hi=M, members=(f"{M}_{N}_{K}",), verified=True, torch="")


@pytest.fixture
def lib():
    def use(*entries):
        dispatch.use_library(Library(entries))

    yield use
    dispatch.use_library(Library())


def scripted(times: dict, calls: list):
    """A timer that runs each callable once (the launch must work) and reports the scripted times."""

    def timer(fns, min_calls=20):
        calls.append((sorted(fns), min_calls))
        for f in fns.values():
            f()
        return {k: times[k] for k in fns}

    return timer


@pytest.mark.interpreter
@pytest.mark.parametrize("times,want", [({"nn": 1.0, "tn": 2.0}, "nn"), ({"nn": 2.0, "tn": 1.0}, "tn"),
                                        # within TIE of each other: the library's order (tn, time 0.01) stands
                                        ({"nn": 1.0, "tn": 1.0 + TIE / 2}, "tn")])
def test_measured_when_both_layouts_have_entries(lib, times, want):
    lib(entry("tn", 0.01), entry("nn", 0.02))
    bufs = make_buffers(P, "cpu", seed=3)
    calls = []
    got = choose(P, "offline", bufs, scripted(times, calls), min_calls=7)
    assert got == LayoutChoice("5_24_16", "offline", want, "measured", (("tn", times["tn"]), ("nn", times["nn"])))
    assert calls == [(["nn", "tn"], 7)]  # no device clock here: the host clock, min_calls calls
    # both timed calls went through gemmrl.mm and wrote the product
    ref = bufs.a.float() @ bufs.bt.t().float()
    assert torch.allclose(bufs.c.float(), ref, atol=2e-2, rtol=2e-2)


def vendor_entry(layout, t, impl, protocol="offline"):
    return Entry(gpu="cpu", cc="", dtype="fp16", acc="fp32", layout=layout, protocol=protocol, M=5, N=24, K=16,
                 family="vendor", impl=impl, algo="", time_ms=t, vendor_best_ms=t, vendor_best=impl,
                 m_lo=5, m_hi=5, members=("5_24_16",), verified=True, torch="")


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore:gemmrl")  # the vendor entry has no vendor path here: torch.matmul serves it
@pytest.mark.parametrize("protocol,times,want", [
    ("offline", {"tn": 1.0, "nn": 1.015}, "nn"),  # the Triton layout is within 2%: its cheaper host path wins
    ("server", {"tn": 1.0, "nn": 1.015}, "nn"),
    ("offline", {"tn": 1.0, "nn": 1.03}, "tn"),   # outside the band: device time decides
    ("offline", {"tn": 1.0, "nn": 0.9}, "nn"),
    ("cold", {"tn": 1.0, "nn": 1.015}, "tn"),     # a device-timed protocol: no host cost in it
])
def test_host_protocols_weigh_the_served_paths_host_cost(lib, protocol, times, want):
    """tn is served by a cuBLASLt entry (library order first), nn by a Triton config (direct launch: cheaper host
    path, library.HOST_ORDER): in offline and server the nn layout wins within HOST_BAND of tn's device time."""
    lib(vendor_entry("tn", 0.01, "cublaslt_autotuned_tn", protocol), entry("nn", 0.0101, protocol=protocol))
    got = choose(P, protocol, make_buffers(P, "cpu", seed=3), scripted(times, []), min_calls=3)
    assert (got.layout, got.by) == (want, "measured")


@pytest.mark.interpreter
@pytest.mark.parametrize("entries,want", [((), "tn"), (("nn",), "nn"), (("tn",), "tn")])
def test_library_decides_with_fewer_than_two_entries(lib, entries, want):
    lib(*(entry(lay, 0.01) for lay in entries))

    def never(fns, min_calls=20):
        raise AssertionError("no timing when the library has an entry for at most one layout")

    got = choose(P, "graph", make_buffers(P, "cpu"), never)
    assert (got.layout, got.by, got.times_ms) == (want, "library", ())


@pytest.mark.interpreter
@pytest.mark.parametrize("entries,times,want", [((), {"nn": 1.0, "tn": 2.0}, "nn"), ((), {"nn": 1.0, "tn": 1.0}, "tn"),
                                                (("tn",), {"nn": 0.9, "tn": 1.0}, "nn"),
                                                (("nn",), {"nn": 1.0, "tn": 1.0 + TIE / 2}, "nn")])
def test_where_the_fallback_race_serves_both_layouts_are_timed(lib, monkeypatch, entries, times, want):
    """On a CUDA device with the fallback racing, a layout without an entry is served by the vendor plan raced best
    for it, not torch.matmul: both are timed (tn first where neither has an entry; a tie keeps the first)."""
    monkeypatch.setattr("gemmrl.serve.layout_choice.races", lambda device: True)
    lib(*(entry(lay, 0.01) for lay in entries))
    calls = []
    got = choose(P, "graph", make_buffers(P, "cpu", seed=3), scripted(times, calls))
    assert (got.layout, got.by) == (want, "measured") and calls and calls[0][0] == ["nn", "tn"]


def test_the_fallback_races_only_on_cuda_in_race_mode(monkeypatch):
    from gemmrl.serve.layout_choice import races

    monkeypatch.delenv("GEMMRL_VENDOR_FALLBACK", raising=False)
    assert races(torch.device("cpu")) is False
    cuda = type("D", (), {"type": "cuda"})()
    assert races(cuda) is True
    monkeypatch.setenv("GEMMRL_VENDOR_FALLBACK", "heuristic")
    assert races(cuda) is False


@pytest.mark.interpreter
def test_library_order_reads_the_protocol_asked(lib):
    lib(entry("tn", 0.03, protocol="graph"), entry("nn", 0.01, protocol="graph"), entry("tn", 0.01),
        entry("nn", 0.05))
    dev = torch.device("cpu")
    assert library_order(P, "graph", dev) == [(0.01, "nn"), (0.03, "tn")]
    assert library_order(P, "offline", dev) == [(0.01, "tn"), (0.05, "nn")]
    assert library_order(GemmProblem(7, 24, 16), "offline", dev) == []  # no entry at this M


@pytest.mark.interpreter
def test_pick_layout_times_both_on_this_machine(lib):
    lib(entry("tn", 0.01), entry("nn", 0.01))
    got = gemmrl.pick_layout("5_24_16", protocol="offline", device="cpu", min_calls=2)
    assert got.by == "measured" and got.layout in ("tn", "nn")
    assert [lay for lay, _ in got.times_ms] == ["tn", "nn"] and all(t > 0 and math.isfinite(t) for _, t in got.times_ms)


def test_pick_layout_rejects_bad_arguments():
    with pytest.raises(ValueError, match="protocol 'warm'; use one of graph, cold, offline, server"):
        gemmrl.pick_layout("5_24_16", protocol="warm", device="cpu")
    with pytest.raises(dispatch.DispatchError, match="dtype torch.float32 is not served"):
        gemmrl.pick_layout("5_24_16", dtype=torch.float32, device="cpu")
    with pytest.raises(dispatch.DispatchError, match="shapes as 'M_N_K'"):
        gemmrl.pick_layout(object(), device="cpu")


@pytest.mark.interpreter
@pytest.mark.parametrize("times,want", [({"nn": 1.0, "tn": 2.0}, "nn"), ({"nn": 2.0, "tn": 1.0}, "tn")])
def test_bench_candidate_keeps_the_measured_layout(lib, times, want):
    lib(entry("tn", 0.01), entry("nn", 0.02))
    bufs = make_buffers(P, "cpu", seed=5)
    cand = GemmrlCandidate()
    cand.prepare(P, bufs, "offline", scripted(times, []))
    assert cand.layout == want
    assert f"layout={want} by measured" in cand.info()["algo"]
    bufs.c.fill_(float("nan"))
    cand(*bufs.args())
    assert torch.allclose(bufs.c.float(), bufs.a.float() @ bufs.b.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.interpreter
def test_device_timed_protocols_time_once(lib):
    lib(entry("tn", 0.01, protocol="graph"), entry("nn", 0.02, protocol="graph"))
    calls = []
    got = choose(P, "graph", make_buffers(P, "cpu"), scripted({"nn": 1.0, "tn": 3.0}, calls), min_calls=9)
    assert (got.layout, got.by, calls) == ("nn", "measured", [(["nn", "tn"], 9)])
    calls.clear()
    got = choose(P, "cold", make_buffers(P, "cpu"), scripted({"nn": 1.0, "tn": 3.0}, calls), min_calls=9)
    assert (got.layout, calls) == ("nn", [(["nn", "tn"], COLD_CALLS)])


@pytest.mark.parametrize("protocol,cuda,cpu", [("graph", "graph", "graph"), ("cold", "cold", "cold"),
                                               ("offline", REFILLED, "offline"), ("server", REFILLED, "server")])
def test_host_protocols_choose_in_device_time_on_their_own_inputs(protocol, cuda, cpu):
    """A host protocol's layout is chosen with the device clock on the inputs its calls see (the host loop's refill,
    no flush: timing.time_refilled); without a device clock (CPU tier), with the protocol's own host clock."""
    assert (timed_in(protocol, "cuda"), timed_in(protocol, "cpu")) == (cuda, cpu)


@pytest.mark.parametrize("how", ["cold", REFILLED])
def test_make_timer_dispatches_the_refilled_timing(monkeypatch, how):
    import gemmrl.timing as T

    seen = []
    for name in ("time_cold", "time_refilled"):
        monkeypatch.setattr(T, name, lambda fns, bufs, cfg, calls=None, name=name: (
            seen.append((name, calls)), {k: T.Timing(how, 0.001, 1.0, 1, 0.001, 0.001) for k in fns})[1])
    got = T.make_timer(make_buffers(P, "cpu"), how)({"a": lambda: None}, 7)
    assert got == {"a": 0.001} and seen == [("time_cold" if how == "cold" else "time_refilled", 7)]


@pytest.mark.interpreter
@pytest.mark.parametrize("how", ["cold", REFILLED])
def test_a_choice_timed_call_by_call_takes_cold_calls(lib, monkeypatch, how):
    import gemmrl.serve.layout_choice as lc

    lib(entry("tn", 0.01), entry("nn", 0.02))
    monkeypatch.setattr(lc, "timed_in", lambda protocol, device_type="cuda": how)  # as on a GPU
    calls = []
    got = choose(P, "offline", make_buffers(P, "cpu"), scripted({"nn": 1.0, "tn": 3.0}, calls), min_calls=9)
    assert (got.layout, got.by, calls) == ("nn", "measured", [(["nn", "tn"], COLD_CALLS)])
