"""search/costmodel.py: the ring depth and the load-dependent latency (the ring-depth fix's change).

The screens showed a Triton ring of 2 stages 1.3-1.8x slower than 3-5 stages once a program runs more than a few
K steps (tiled and split-K alike), while the model of the small-tile re-screen tied them at bandwidth-bound shapes and then
preferred the shallow ring (smaller shared memory, more programs resident); `gemmrl select --diverse` then screened
only 2-stage configs at long K (2048_128_8192: 23.3 us picked against 14.5 us for the 5-stage twin)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gemmrl.kernels.triton_gemm.configs import H100, parse_config
from gemmrl.problem import parse_mnk
from gemmrl.search.costmodel import DEFAULT, estimate, prune_diverse
from conftest import script_module

SPLITK = "splitk(BM=64,BN=64,BK=128,warps=4,stages={s},group_m=8,split={k},reduction=fused,tma=False,nondeterministic=False)"
TILED = "tiled(BM=64,BN=64,BK=64,warps=4,stages={s},group_m=8)"


@pytest.mark.parametrize("warm", [True, False], ids=["graph", "cold"])
@pytest.mark.parametrize("mnk,tmpl,k", [("2048_128_8192", SPLITK, 4), ("2048_128_8192", SPLITK, 2),
                                        ("1024_1024_8192", TILED, 1), ("64_4096_4096", TILED, 1)])
def test_a_two_stage_ring_loses_at_long_k(mnk, tmpl, k, warm):
    p = parse_mnk(mnk, layout="tn")
    two, three = (estimate(parse_config(tmpl.format(s=s, k=k)), p, H100, warm).seconds for s in (2, 3))
    assert two > three * 1.01


def test_diverse_top_has_no_two_stage_ring_at_long_k():
    p = parse_mnk("2048_128_8192", layout="tn")
    for warm in (True, False):
        picks = prune_diverse(p, 12, warm_l2=warm)
        deep = [c for c in picks if c.stages >= 3]
        assert len(deep) >= 8, [str(c) for c in picks]


def test_at_one_k_step_the_ring_depth_only_costs_fill():
    p = parse_mnk("512_256_64", layout="tn")
    cfg = "tiled(BM=32,BN=32,BK=64,warps=2,stages={s},group_m=1)"
    two, five = (estimate(parse_config(cfg.format(s=s)), p, H100, True) for s in (2, 5))
    assert two.mainloop == pytest.approx(five.mainloop)


def test_cold_latency_follows_where_the_loads_are_served():
    """A decode shape streams its operands once (cold: every load misses in L2), a large cube re-reads them
    (most loads hit): raising the HBM latency moves the decode shape's estimate and hardly the cube's."""
    slow = replace(DEFAULT, latency_us=3 * DEFAULT.latency_us)
    decode = parse_mnk("16_4096_4096", layout="tn"), parse_config("tiled(BM=16,BN=32,BK=128,warps=2,stages=3,group_m=1)")
    cube = parse_mnk("4096_4096_4096", layout="tn"), parse_config(TILED.format(s=4))
    moved = {}
    for name, (p, c) in {"decode": decode, "cube": cube}.items():
        moved[name] = estimate(c, p, H100, False, slow).mainloop / estimate(c, p, H100, False).mainloop
    assert moved["decode"] > 1.3
    assert moved["cube"] < 1.05
    # warm (graph), the HBM latency plays no part
    for p, c in (decode, cube):
        assert estimate(c, p, H100, True, slow).seconds == pytest.approx(estimate(c, p, H100, True).seconds)


def test_ring_slack_and_resident_overlap_are_constants_of_the_fit():
    from dataclasses import fields

    from gemmrl.search.costmodel import CostParams

    names = {f.name for f in fields(CostParams)}
    assert {"ring_slack", "resident_overlap", "fill_latency_us", "fill_l2_latency_us"} <= names
    assert 0.0 <= DEFAULT.ring_slack < 1.0 and 0.0 <= DEFAULT.resident_overlap <= 1.0


@pytest.mark.parametrize("variant", ["persistent", "tiled"])
def test_a_grouped_tile_order_wins_at_many_waves_and_ties_within_one(variant):
    """Screens: group_m 8 against 1, 4-9% faster above 1024 tiles, ~1% at one wave or less."""
    def cfg(g):
        if variant == "persistent":
            return parse_config(f"persistent(BM=128,BN=256,BK=64,warps=4,stages=3,group_m={g},order=m,tma=True,"
                                "flatten=False,ws=True,subtile=False,ctas_per_sm=1)")
        return parse_config(f"tiled(BM=128,BN=128,BK=64,warps=4,stages=4,group_m={g})")
    big, one_wave = parse_mnk("16384_4096_16384", layout="tn"), parse_mnk("1024_1024_4096", layout="tn")
    for warm in (True, False):
        assert estimate(cfg(1), big, H100, warm).seconds > estimate(cfg(8), big, H100, warm).seconds * 1.02
        assert estimate(cfg(1), one_wave, H100, warm).seconds == pytest.approx(estimate(cfg(8), one_wave, H100, warm).seconds)


@pytest.mark.parametrize("mnk", ["1_4096_4096", "1_14336_4096"])
def test_the_gemv_leads_at_m_1_in_graph(mnk):
    """At M = 1 the swap-AB MMA kernel pads 15 of 16 rows; measured on an H100 in the graph protocol (the GEMV run's
    the Triton-family bar re-measure): the GEMV (smallm, mma=False) ran 1_4096_4096 in 7.0 us against 8.7 for vendor_best and 15.2
    for the swap-AB pick before it. The model ranks a GEMV first there, and its diverse top 12 holds several."""
    p = parse_mnk(mnk, layout="tn")
    picks = prune_diverse(p, 12, warm_l2=True)
    assert not picks[0].mma, [str(c) for c in picks]
    assert sum(not getattr(c, "mma", True) for c in picks) >= 3


def test_gemv_streams_b_in_long_k_steps():
    """Loads straight into registers: the in-flight bytes are one step's tile per program, so at 1_4096_4096 a block
    K of 512 beats 128 (the GEMV run's probe, h100_gemv-probe_m1_graph-cold_2026-11-26.csv: 6.6 us at BN 16 x BK 512
    against 10.6 at BN 32 x BK 128) and the GEMV beats the swap-AB pick before it (smallm BM=16, BN=32, BK=128,
    warps=1, split=3: 15.2 us)."""
    p = parse_mnk("1_4096_4096", layout="tn")
    gemv = "smallm(BM=1,BN=16,BK={bk},warps=4,stages=1,split=1,reduction=none,tma=False,mma=False)"
    long_k, short_k = (estimate(parse_config(gemv.format(bk=bk)), p, H100, True).seconds for bk in (512, 128))
    assert long_k < short_k
    served = parse_config("smallm(BM=16,BN=32,BK=128,warps=1,stages=4,split=3,reduction=fused,tma=False)")
    assert long_k < estimate(served, p, H100, True).seconds


# The traffic probe's traffic probe (benchmarks/results/h100/h100_fewtile_probe9_traffic-probe_*): on few-tile long-K shapes the
# two-pass split-K configs with pointer loads were the fastest measured (256_512_4096 graph 6.80 us against 9.40 for
# the model's pick, fused with TMA); the model had charged the reduction kernel a whole first-launch cost.
TWO_PASS = ("splitk(BM=64,BN=64,BK=128,warps=4,stages=4,group_m=8,split=4,reduction={red},tma={tma},"
            "nondeterministic=False)")


# measured two-pass / fused, graph: 6.80 / 7.92 and 10.64 / 11.56 us (the model still has them within 1-3% of each
# other at 1024_256_4096 and 256_1024_12288, where the probe measured 11.74 / 13.47 and 24.48 / 25.80)
@pytest.mark.parametrize("mnk", ["256_512_4096", "2048_64_8192"])
def test_the_second_kernel_of_a_two_pass_call_costs_less_than_a_first_launch(mnk):
    p = parse_mnk(mnk, layout="tn")
    two = estimate(parse_config(TWO_PASS.format(red="two_pass", tma=False)), p, H100, True)
    fused = estimate(parse_config(TWO_PASS.format(red="fused", tma=False)), p, H100, True)
    assert two.launch == pytest.approx((DEFAULT.launch_us + DEFAULT.launch2_us) * 1e-6)
    assert DEFAULT.launch2_us < DEFAULT.launch_us and two.seconds < fused.seconds


def test_device_side_descriptors_cost_once_per_program():
    """tl.make_tensor_descriptor runs in every program before its first load: per wave for a one-tile program, once
    for a persistent one however many tiles it then runs (not once per tile)."""
    p = parse_mnk("256_512_4096", layout="tn")
    ptr, tma = (estimate(parse_config(TWO_PASS.format(red="two_pass", tma=t)), p, H100, True) for t in (False, True))
    assert tma.fill - ptr.fill == pytest.approx(DEFAULT.tma_setup_us * 1e-6)
    big = parse_mnk("8192_8192_1024", layout="tn")   # 4096 tiles of 128x128: ~31 per persistent program
    pers = "persistent(BM=128,BN=128,BK=64,warps=4,stages=3,group_m=8,order=m,tma={t},flatten=False,ws=False," \
           "subtile=False,ctas_per_sm=1)"
    a, b = (estimate(parse_config(pers.format(t=t)), big, H100, False) for t in (False, True))
    assert b.fill - a.fill == pytest.approx(DEFAULT.tma_setup_us * 1e-6)
    zero = replace(DEFAULT, tma_setup_us=0.0)
    assert estimate(parse_config(pers.format(t=True)), big, H100, False, zero).fill == pytest.approx(a.fill)


@pytest.mark.parametrize("mnk", ["8192_12288_64", "1024_8192_256", "16384_1024_512", "4096_4096_4096", "1000_3000_200"])
def test_pingpong_hides_its_epilogue_under_the_other_warpgroups_main_loop(mnk):
    """CUTLASS ping-pong stores one consumer's C tile while the other's main loop runs: where the C write dominates
    (K = 64-512 with large M x N) it is priced below the cooperative schedule of the same tile (measured on the
    H100: 8192_12288_64 cold, ping-pong 74-75 us, cooperative and Triton ws ~80); the cooperative price does not
    depend on the constant, and the ring-depth fix's constants (what saved policies were trained on) price it as before."""
    from dataclasses import replace

    from gemmrl.kernels import cutlass_sm90 as cs
    from gemmrl.problem import parse_mnk
    from gemmrl.search import costmodel as cm

    p = parse_mnk(mnk)
    pp = cs.CutlassConfig(128, 128, 64, 1, 1, "pingpong")
    coop = cs.CutlassConfig(128, 128, 64, 1, 1, "coop")
    knobs = cs.Knobs()
    off = replace(cm.DEFAULT, pingpong_overlap=0.0)
    for warm in (False, True):
        e_pp, e_off = cm.estimate_cutlass(pp, knobs, p, warm_l2=warm), cm.estimate_cutlass(pp, knobs, p, warm_l2=warm, params=off)
        e_coop = cm.estimate_cutlass(coop, knobs, p, warm_l2=warm)
        assert e_pp.seconds <= e_off.seconds
        assert e_coop.seconds == cm.estimate_cutlass(coop, knobs, p, warm_l2=warm, params=off).seconds
        assert e_off.seconds == pytest.approx(e_coop.seconds)  # overlap 0: the two schedules priced alike
        # never under the longest of the main loop, the HBM traffic and the launch
        assert e_pp.seconds >= max(e_pp.mainloop, e_pp.hbm) + e_pp.launch
        assert cm.estimate_cutlass(pp, knobs, p, warm_l2=warm, params=cm.LEGACY_PARAMS).seconds == cm.estimate_cutlass(
            pp, knobs, p, warm_l2=warm, params=replace(cm.LEGACY_PARAMS, pingpong_overlap=0.0)).seconds
    if p.K <= 512 and p.M * p.N >= 2 ** 23:  # C-write-bound: the overlap is worth several percent
        assert cm.estimate_cutlass(pp, knobs, p).seconds < 0.95 * cm.estimate_cutlass(coop, knobs, p).seconds


def test_cutlass_check_script_scores_the_overlap_against_a_screen(tmp_path, capsys):
    """benchmarks/acceptance/costmodel_cutlass_ranking.py: on a screen where the ping-pong configs measured fastest at a C-write-bound
    shape, the model's top-1 regret is 1 with the overlap on and > 1 with it off (the model then prefers the
    cooperative 128x256 tile there); fewer than 4 CUTLASS configs in a cell is no cell; no cell at all exits 2."""
    from gemmrl.results import ResultsWriter

    mod = script_module("costmodel_cutlass_ranking")

    def row(mnk, cfg, us, proto="cold"):
        return {"mnk": mnk, "dtype": "fp16", "acc": "fp32", "protocol": proto, "candidate": f"cutlass:{cfg}:s1_rh_dheuristic_k1",
                "time_ms": us / 1e3, "tflops": 1.0, "verified": "true", "info": "screen", "layout": "tn", "rep": 0}

    measured = {"pingpong_64x192x64_c1x1_persistent_tn_fp16": 74.5, "pingpong_128x128x64_c1x1_persistent_tn_fp16": 75.0,
                "coop_128x128x64_c1x2_persistent_tn_fp16": 80.1, "coop_128x256x64_c1x1_persistent_tn_fp16": 81.0}
    path = tmp_path / "screen.csv"
    ResultsWriter(path).write_batch([row("8192_12288_64", c, t) for c, t in measured.items()]
                                    + [row("1024_1024_64", c, 5.0) for c in list(measured)[:3]])  # 3 configs: no cell
    by = mod.cells(mod.read_rows([str(path)]))
    assert list(by) == [("8192_12288_64", "cold")]
    on, off = mod.score(by, DEFAULT), mod.score(by, replace(DEFAULT, pingpong_overlap=0.0))
    assert on["regret1"] == pytest.approx(1.0) and off["regret1"] > 1.05
    assert on["pingpong_best"] == off["pingpong_best"] == 1 and on["pingpong_best_in_top4"] == 1
    assert mod.main([str(path), "--values", "0,1"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 4 and lines[2].startswith("| 0 | 1 | ") and lines[3].startswith("| 1 | 1 | 1.000 | 1.000 |")
    empty = tmp_path / "empty.csv"
    ResultsWriter(empty).write_batch([row("1024_1024_64", c, 5.0) for c in list(measured)[:3]])
    assert mod.main([str(empty)]) == 2 and "no (shape, protocol)" in capsys.readouterr().err


@pytest.mark.parametrize("mnk", ["64_64_1024", "256_128_1024", "1024_1024_12288", "64_256_16384"])
def test_streamk_pays_its_workspace_and_each_split(mnk):
    """A CUTLASS stream-K call zeroes its workspace barriers and initializes on every call, and each split of a tile
    goes through the workspace: measured over the committed screens ~1 us more than the persistent config of the same
    tile, and ~4.5 / 9 / 11.5 us more at 2 / 4 / 8 splits on shapes under 30 us. So more splits cost more fixed time,
    and the ring-depth fix's constants (saved policies) price stream-K as before."""
    from gemmrl.kernels import cutlass_sm90 as cs
    from gemmrl.search import costmodel as cm

    p = parse_mnk(mnk)
    cfg = cs.CutlassConfig(128, 16, 128, 1, 1, "coop", scheduler="streamk", swap=True)
    zero = replace(cm.DEFAULT, streamk_us=0.0, streamk_split_us=0.0)
    for warm in (False, True):
        prev = None
        for splits in (1, 2, 4, 8):
            knobs = cs.Knobs(decomposition="splitk" if splits > 1 else "heuristic", splits=splits)
            t, t0 = (cm.estimate_cutlass(cfg, knobs, p, warm_l2=warm, params=q).seconds for q in (cm.DEFAULT, zero))
            extra = (cm.DEFAULT.streamk_us + cm.DEFAULT.streamk_split_us * (splits - 1)) * 1e-6
            assert t == pytest.approx(t0 + extra)
            if prev is not None:
                assert t - t0 > prev
            prev = t - t0
            legacy = cm.estimate_cutlass(cfg, knobs, p, warm_l2=warm, params=cm.LEGACY_PARAMS).seconds
            assert legacy == cm.estimate_cutlass(cfg, knobs, p, warm_l2=warm,
                                              params=replace(cm.LEGACY_PARAMS, streamk_us=0.0, streamk_split_us=0.0)).seconds
