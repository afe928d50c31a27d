"""The launch-bound table (serve/launch_bound.py): which shapes count as launch-bound, and the small Triton tiles
they race: valid under the Triton family's predicate, distinct tiles, ranked by the cost model, stable, off by
GEMMRL_LAUNCH_BOUND=0, entries measured nowhere (so a winner goes through the battery)."""

from __future__ import annotations

import pytest

from gemmrl.kernels.triton_gemm.configs import H100, Arch, parse_config, valid
from gemmrl.problem import GemmProblem
from gemmrl.search.costmodel import floor_seconds
from gemmrl.serve import launch_bound as LB

H200 = Arch(name="NVIDIA H200", cc=90, num_sms=132, smem_per_block=232448, smem_per_sm=233472, hbm_tbps=4.8)

SMALL = ["4_14_2", "3_2_56", "1_6888_1", "1016_32_64", "208_2552_16", "8_8_896", "6240_8_8", "5_4536_457",
         "1_1_1", "17_9_1000"]
LARGE = ["4096_4096_4096", "1_4096_4096", "53_13594_5407", "2928_1600_5688", "16_14336_4096"]


def _p(mnk: str, dtype: str = "fp16", layout: str = "tn") -> GemmProblem:
    M, N, K = map(int, mnk.split("_"))
    return GemmProblem(M, N, K, dtype, "fp32", layout)


@pytest.mark.parametrize("arch", [H100, H200], ids=["h100", "h200"])
@pytest.mark.parametrize("mnk", SMALL)
@pytest.mark.parametrize("dtype, layout", [("fp16", "tn"), ("bf16", "nn")])
def test_a_launch_bound_shape_races_count_valid_distinct_tiles_fastest_first(arch, mnk, dtype, layout):
    p = _p(mnk, dtype, layout)
    assert LB.launch_bound(p, arch) and floor_seconds(p, arch) < LB.FLOOR_S
    got = LB.configs(p, arch)
    assert len(got) == LB.COUNT
    assert len({(c.BM, c.BN) for c in got}) == LB.COUNT  # distinct tiles, not stage twins of one
    assert all(valid(c, p, arch)[0] for c in got)
    ranked = [str(c) for c in LB.table(p, arch)]
    assert ranked.index(str(got[0])) == 0 and [ranked.index(str(c)) for c in got] == sorted(ranked.index(str(c)) for c in got)
    assert [str(c) for c in LB.configs(p, arch)] == [str(c) for c in got]  # the same on every call


@pytest.mark.parametrize("mnk", LARGE)
def test_a_shape_its_arithmetic_or_bytes_decide_races_no_table_tile(mnk):
    p = _p(mnk)
    assert not LB.launch_bound(p, H200) and LB.configs(p, H200) == []
    assert LB.contenders(p, "NVIDIA H200", H200) == ()


def test_contenders_are_triton_entries_measured_nowhere_that_parse_back():
    p = _p("1016_32_64")
    got = LB.contenders(p, "NVIDIA H200", H200)
    assert [e.impl for e in got] == [str(c) for c in LB.configs(p, H200)]
    for e in got:
        assert e.family == "triton" and e.members == () and not e.verified and e.source == LB.SOURCE
        assert (e.M, e.N, e.K, e.dtype, e.layout, e.gpu) == (1016, 32, 64, "fp16", "tn", "NVIDIA H200")
        assert str(parse_config(e.impl)) == e.impl and e.time_ms > 0


def test_the_switch(monkeypatch):
    p = _p("4_14_2")
    monkeypatch.setattr(LB, "arch_here", lambda: H200)
    monkeypatch.setenv(LB.ENV, "0")
    assert not LB.enabled() and LB.here(p, "NVIDIA H200") == ()
    monkeypatch.setenv(LB.ENV, "1")
    assert LB.here(p, "NVIDIA H200") == LB.contenders(p, "NVIDIA H200", H200) != ()
    assert LB.here(p, "cpu") == ()
    monkeypatch.setenv(LB.ENV, "yes")
    with pytest.raises(LB.LaunchBoundError, match="GEMMRL_LAUNCH_BOUND='yes': use 1 .* or 0"):
        LB.enabled()


def test_without_a_cuda_device_nothing_races(monkeypatch):
    monkeypatch.setattr(LB, "arch_here", lambda: None)
    assert LB.here(_p("4_14_2"), "NVIDIA H200") == ()
