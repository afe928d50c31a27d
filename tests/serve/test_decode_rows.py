"""The decode rows (serve/decode_rows.py): at M = 1..32, layout tn, the fallback race also times the configs the decode
family picks first, valid under its predicate, none past M = 32 or in nn, off by GEMMRL_DECODE_ROWS=0 or without
nvcc, entries measured nowhere (a winner goes through the battery); a first sight under a build cap defers a
contender whose nvcc build is not cached (dispatch._BuildBudget)."""

from __future__ import annotations

import math

import pytest

from gemmrl.kernels import decode_gemm as dg
from gemmrl.kernels.registry import family
from gemmrl.kernels.triton_gemm.configs import H100, Arch
from gemmrl.problem import GemmProblem
from gemmrl.serve import decode_rows as DR
from gemmrl.serve import dispatch
from gemmrl.serve import launch_bound as LB

H200 = Arch(name="NVIDIA H200", cc=90, num_sms=132, smem_per_block=232448, smem_per_sm=233472, hbm_tbps=4.8)


def _p(mnk: str, dtype: str = "fp16", layout: str = "tn") -> GemmProblem:
    M, N, K = map(int, mnk.split("_"))
    return GemmProblem(M, N, K, dtype, "fp32", layout)


@pytest.mark.parametrize("arch", [H100, H200], ids=["h100", "h200"])
@pytest.mark.parametrize("mnk", ["1_14336_4096", "8_4096_14336", "16_10240_8192", "32_8192_28672", "3_37_72",
                                 "17_1000_1032", "1_1_8"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_decode_shape_races_the_familys_first_picks(arch, mnk, dtype):
    p = _p(mnk, dtype)
    got = DR.configs(p, arch)
    assert 1 <= len(got) <= DR.COUNT
    assert [str(c) for c in got] == [str(c) for c in dg.screen_configs(p, arch.num_sms)][:len(got)]
    assert all(dg.valid(c, p, arch.num_sms)[0] and c.dtype == dtype for c in got)


@pytest.mark.parametrize("mnk,layout", [("33_4096_4096", "tn"), ("64_4096_4096", "tn"), ("4096_4096_4096", "tn"),
                                        ("1_4096_4096", "nn"), ("1_4096_4100", "tn")])
def test_no_rows_past_the_decode_range_in_nn_or_at_an_odd_k(mnk, layout):
    assert DR.configs(_p(mnk, layout=layout), H200) == [] and DR.contenders(_p(mnk, layout=layout), "g", H200) == ()
    # an architecture the family is not built for: none either
    assert DR.configs(_p("1_4096_4096"), Arch(name="A100", cc=80, num_sms=108, smem_per_block=166912,
                                             smem_per_sm=167936)) == []


def test_rows_are_decode_entries_measured_nowhere_that_parse_back():
    p = _p("8_4096_14336", "bf16")
    got = DR.contenders(p, "NVIDIA H200", H200)
    assert [e.impl for e in got] == [str(c) for c in DR.configs(p, H200)] and got
    floor_ms = 2 * (4096 * 14336 + 8 * 14336 + 8 * 4096) / 4.8e12 * 1e3
    for e in got:
        assert e.family == "decode" and e.members == () and not e.verified and e.source == DR.SOURCE
        assert (e.M, e.N, e.K, e.dtype, e.layout) == (8, 4096, 14336, "bf16", "tn")
        assert str(dg.DecodeConfig.parse(e.impl)) == e.impl and e.time_ms == pytest.approx(floor_ms)


def test_the_switch_and_nvcc(monkeypatch):
    p = _p("1_4096_4096")
    monkeypatch.setattr(LB, "arch_here", lambda: H200)
    monkeypatch.setattr(DR, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")
    monkeypatch.setenv(DR.ENV, "0")
    assert not DR.enabled() and DR.here(p, "NVIDIA H200") == ()
    monkeypatch.setenv(DR.ENV, "1")
    assert DR.here(p, "NVIDIA H200") == DR.contenders(p, "NVIDIA H200", H200) != ()
    assert DR.here(p, "cpu") == ()
    monkeypatch.setattr(DR, "find_nvcc", lambda: None)  # the family builds with nvcc: none without it
    assert DR.here(p, "NVIDIA H200") == ()
    monkeypatch.setenv(DR.ENV, "yes")
    with pytest.raises(DR.DecodeRowsError, match="GEMMRL_DECODE_ROWS='yes': use 1 .* or 0"):
        DR.enabled()


def test_a_capped_first_sight_defers_an_unbuilt_nvcc_contender_and_builds_ready_ones():
    made = []

    def make(name):
        return lambda: made.append(name) or name

    capped = dispatch._BuildBudget(2.0)
    assert capped.build("decode:a", make("decode:a"), lambda: False) is None   # an nvcc run: warmup builds it
    assert capped.build("decode:b", make("decode:b"), lambda: True) == "decode:b"  # cached: loads in ms
    assert capped.build("triton:c", make("triton:c")) == "triton:c"          # no ready(): builds in seconds
    assert made == ["decode:b", "triton:c"] and capped.deferred == ["decode:a"]
    assert capped.raced(["decode:a", "decode:b", "triton:c"]) == ("decode:b", "triton:c")
    assert capped.build("decode:a", make("decode:a"), lambda: True) is None  # deferred stays deferred in this sight
    ahead = dispatch._BuildBudget(math.inf)  # warmup, served_by, a bench's preparation: everything builds
    assert ahead.build("decode:a", make("decode:a"), lambda: False) == "decode:a" and ahead.deferred == []


def test_ready_is_the_build_cache(monkeypatch):
    """ready: the dtype's object built in this process or found in the disk cache (cuda_source.cached, tested with
    real builds in tests/kernels/test_cuda_source.py); without a GPU to name the arch and none given, nothing
    counts as built."""
    from gemmrl.kernels import cuda_source

    cfg = dg.DecodeConfig(1, 1, 8, 4, 1, "bf16", 4)
    e = DR.entry_for(cfg, _p("1_4096_4096", "bf16"), "g", H200)
    assert family("decode").ready is not None and family("cutlass").ready is not None and family("triton").ready is None
    monkeypatch.setattr(dg._FAMILY, "built", {})
    monkeypatch.setenv("GEMMRL_CUDA_ARCH", "90a")
    asked = []
    monkeypatch.setattr(cuda_source, "cached", lambda src, arch: asked.append((src.flags, arch)) or False)
    assert not dg.ready(cfg) and not dispatch._ready(e)
    assert asked[0] == (("-DGEMMRL_BF16=1",), "90a")
    monkeypatch.setattr(cuda_source, "cached", lambda src, arch: True)
    assert dg.ready(cfg) and dispatch._ready(e)
    monkeypatch.setattr(cuda_source, "cached", lambda src, arch: False)
    monkeypatch.setattr(dg._FAMILY, "built", {("bf16", "90a"): cuda_source.Build("k", "90a", "/x.so")})
    assert dg.ready(cfg)  # built in this process
    monkeypatch.setattr(dg._FAMILY, "built", {})
    monkeypatch.delenv("GEMMRL_CUDA_ARCH")
    monkeypatch.delenv("GEMMRL_IMPORT_ARCH", raising=False)
    if not __import__("torch").cuda.is_available():
        monkeypatch.setattr(cuda_source, "cached", lambda src, arch: True)
        assert not dg.ready(cfg)  # no arch to look under


def test_a_cutlass_contender_is_ready_when_its_object_is_cached(monkeypatch):
    """A CUTLASS entry racing as a contender (a relabelled library's pick) builds with nvcc for tens of seconds: a
    capped first sight races it only where the build cache holds its object."""
    from gemmrl.kernels import cuda_source
    from gemmrl.library import Entry

    impl = "coop_128x128x64_c1x1_persistent_tn_fp16:s1_rh_dheuristic_k1"
    e = Entry(gpu="g", cc="9.0", dtype="fp16", acc="fp32", layout="tn", protocol="graph", M=64, N=4096, K=4096,
              family="cutlass", impl=impl, algo=impl, time_ms=0.01, vendor_best_ms=0.011, vendor_best="cublas_tn",
              m_lo=64, m_hi=64, members=("64_4096_4096",), verified=True)
    seen = []
    monkeypatch.setattr(cuda_source, "cached", lambda src, arch=None: seen.append(src.name) or False)
    assert not dispatch._ready(e) and seen and "coop_128x128x64" in seen[0]
    monkeypatch.setattr(cuda_source, "cached", lambda src, arch=None: True)
    assert dispatch._ready(e)
