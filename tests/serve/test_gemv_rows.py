"""The GEMV rows table (serve/gemv_rows.py): at M = 1..8 the fallback race also times Triton GEMV configs (smallm,
mma=False) the cost model ranks best: valid under the family's predicate, distinct (BN, BK), BM the next power of two
of M, none past M = 8, off by GEMMRL_GEMV_ROWS=0, entries measured nowhere (a winner goes through the battery)."""

from __future__ import annotations

import pytest

from gemmrl.kernels.triton_gemm.configs import GEMV_MAX_M, H100, Arch, next_pow2, parse_config, valid
from gemmrl.problem import GemmProblem
from gemmrl.serve import gemv_rows as GR
from gemmrl.serve import launch_bound as LB

H200 = Arch(name="NVIDIA H200", cc=90, num_sms=132, smem_per_block=232448, smem_per_sm=233472, hbm_tbps=4.8)


def _p(mnk: str, dtype: str = "fp16", layout: str = "tn") -> GemmProblem:
    M, N, K = map(int, mnk.split("_"))
    return GemmProblem(M, N, K, dtype, "fp32", layout)


@pytest.mark.parametrize("arch", [H100, H200], ids=["h100", "h200"])
@pytest.mark.parametrize("mnk", ["1_4096_4096", "1_14336_4096", "2_6144_4096", "4_128256_4096", "7_1000_777",
                                 "8_4096_14336", "1_6888_1", "3_2_56"])
@pytest.mark.parametrize("dtype, layout", [("fp16", "tn"), ("bf16", "nn")])
def test_a_decode_shape_races_valid_gemv_rows_of_distinct_tiles_fastest_first(arch, mnk, dtype, layout):
    p = _p(mnk, dtype, layout)
    got = GR.configs(p, arch)
    assert 1 <= len(got) <= GR.COUNT
    assert all(c.variant == "smallm" and not c.mma and c.BM == next_pow2(p.M) and valid(c, p, arch)[0] for c in got)
    assert len({(c.BN, c.BK) for c in got}) == len(got)
    ranked = [str(c) for c in GR.table(p, arch)]
    assert [ranked.index(str(c)) for c in got] == sorted(ranked.index(str(c)) for c in got)
    assert ranked.index(str(got[0])) == 0
    assert [str(c) for c in GR.configs(p, arch)] == [str(c) for c in got]  # the same on every call


@pytest.mark.parametrize("M", [GEMV_MAX_M + 1, 16, 64, 4096])
def test_no_rows_past_the_gemv_range(M):
    assert GR.configs(_p(f"{M}_4096_4096"), H200) == [] and GR.contenders(_p(f"{M}_4096_4096"), "g", H200) == ()


def test_rows_are_triton_entries_measured_nowhere_that_parse_back():
    p = _p("1_4096_14336", "bf16")
    got = GR.contenders(p, "NVIDIA H200", H200)
    assert [e.impl for e in got] == [str(c) for c in GR.configs(p, H200)] and got
    for e in got:
        assert e.family == "triton" and e.members == () and not e.verified and e.source == GR.SOURCE
        assert (e.M, e.N, e.K, e.dtype, e.layout) == (1, 4096, 14336, "bf16", "tn")
        assert str(parse_config(e.impl)) == e.impl and e.time_ms > 0


def test_the_switch(monkeypatch):
    p = _p("1_4096_4096")
    monkeypatch.setattr(LB, "arch_here", lambda: H200)
    monkeypatch.setenv(GR.ENV, "0")
    assert not GR.enabled() and GR.here(p, "NVIDIA H200") == ()
    monkeypatch.setenv(GR.ENV, "1")
    assert GR.here(p, "NVIDIA H200") == GR.contenders(p, "NVIDIA H200", H200) != ()
    assert GR.here(p, "cpu") == ()
    monkeypatch.setattr(LB, "arch_here", lambda: None)
    assert GR.here(p, "NVIDIA H200") == ()
    monkeypatch.setenv(GR.ENV, "no")
    with pytest.raises(GR.GemvRowsError, match="GEMMRL_GEMV_ROWS='no': use 1 .* or 0"):
        GR.enabled()
