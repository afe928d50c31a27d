"""The CUTLASS SM90 family: validity predicates, config and knob names, the space, rendering; a compile where nvcc
and the nvidia-cutlass headers exist; on a GPU, configs through the battery and graph capture."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import have_cutlass_toolchain
from gemmrl.kernels import cutlass_sm90 as cs
from gemmrl.problem import GemmProblem


@pytest.mark.parametrize("cfg,why", [
    (cs.CutlassConfig(bm=64, schedule="coop"), "BM=64 must be 128 or 256"),
    (cs.CutlassConfig(bm=256, schedule="pingpong"), "<= 128"),
    (cs.CutlassConfig(bm=256, bn=256), "accumulators"),
    (cs.CutlassConfig(bm=128, bn=256, schedule="pingpong"), "accumulators"),
    (cs.CutlassConfig(bm=256, bn=256, bk=128, schedule="coop"), "stage"),
    (cs.CutlassConfig(cm=4, cn=4), "cluster"),
    (cs.CutlassConfig(cm=3), "cluster"),
    (cs.CutlassConfig(bn=12), "BN 8 or a multiple of 16"),
    (cs.CutlassConfig(bn=24, cm=1), "BN 8 or a multiple of 16"),  # CuTe's stride divisibility fails to compile
    (cs.CutlassConfig(bm=128, schedule="pingpong", scheduler="streamk"), "cooperative"),
    (cs.CutlassConfig(bk=48), "BK"),
    (cs.CutlassConfig(scheduler="streamk", epilogue="nosmem"), "persistent scheduler only"),
    (cs.CutlassConfig(epilogue="smem"), "epilogue"),
    (cs.CutlassConfig(epi_n=48), "epilogue tile width 48"),
    (cs.CutlassConfig(bn=96, epi_n=64), "must divide BN=96"),
    (cs.CutlassConfig(64, 32, 64, 1, 1, "pingpong", swap=True, epilogue="nosmem", epi_n=32), "epilogue tile width 32"),
    (cs.CutlassConfig(64, 64, 64, 1, 1, "pingpong", swap=True, epilogue="nosmem", epi_n=64), "TMA epilogue"),
])
def test_invalid_configs_say_why(cfg, why):
    ok, reason = cs.valid_config(cfg)
    assert not ok and why in reason


@pytest.mark.parametrize("cc", [80, 89, 100])
def test_non_hopper_refused(cc):
    ok, why = cs.valid_config(cs.CutlassConfig(), cc)
    assert not ok and "Hopper" in why


def test_family_valid_and_distinct():
    fam = cs.family()
    assert len(fam) >= 16 and len(set(fam)) == len(fam)
    assert all(cs.valid_config(c)[0] for c in fam)
    assert {c.schedule for c in fam} == {"coop", "pingpong"}
    assert {c.scheduler for c in fam} == {"persistent", "streamk"}
    assert any((c.cm, c.cn) != (1, 1) for c in fam)
    assert {(2, 4), (1, 4)} <= {(c.cm, c.cn) for c in fam} and min(c.bn for c in fam) == 8
    # register-epilogue twins: only of narrow persistent tiles (wide ones ran 11-28% slower with it), each beside its
    # TMA-epilogue twin
    twins = [c for c in fam if c.epilogue == "nosmem"]
    assert twins and all(c.bn <= 32 and c.scheduler == "persistent" for c in twins)
    assert all(replace(c, epilogue="tma") in fam for c in twins)


def test_space_size_reported():
    n = cs.space_size()
    assert n["points"] >= 10_000 and n["configs"] >= 100


@pytest.mark.parametrize("shape,layout,ok,why", [
    ((64, 4096, 64), "tn", True, ""),
    ((1, 4096, 4096), "tn", True, ""),
    ((7, 4096, 100), "tn", False, "multiples of 8"),
    ((7, 100, 64), "tn", False, "multiples of 8"),
    ((64, 64, 64), "nn", False, "problem is fp16/nn"),
])
def test_valid_problem(shape, layout, ok, why):
    got, reason = cs.valid(cs.CutlassConfig(), cs.Knobs(), GemmProblem(*shape, layout=layout))
    assert got is ok and why in reason


def test_valid_knobs():
    p = GemmProblem(128, 128, 4096)
    sk = cs.CutlassConfig(scheduler="streamk")
    assert not cs.valid(cs.CutlassConfig(), cs.Knobs(decomposition="splitk", splits=2), p)[0]
    assert cs.valid(sk, cs.Knobs(decomposition="splitk", splits=2), p)[0]
    assert not cs.valid(sk, cs.Knobs(decomposition="splitk", splits=100), GemmProblem(128, 128, 256))[0]
    assert not cs.valid(cs.CutlassConfig(), cs.Knobs(swizzle=3), p)[0]
    assert cs.valid(cs.CutlassConfig(), cs.Knobs(swizzle=16, raster="n"), p)[0]
    assert cs.valid(cs.CutlassConfig(), cs.Knobs(swizzle=32), p)[0]
    assert not cs.valid(cs.CutlassConfig(), cs.Knobs(swizzle=64), p)[0]
    why = cs.valid(sk, cs.Knobs(swizzle=16), p)[1]
    assert "persistent scheduler only" in why
    # every valid knob setting of a config is in its all_knobs, and the wide swizzles only where valid
    for cfg in (cs.CutlassConfig(), sk):
        wide = {k.swizzle for k in cs.all_knobs(cfg)} & set(cs.WIDE_SWIZZLES)
        assert wide == (set() if cfg.scheduler == "streamk" else set(cs.WIDE_SWIZZLES))
        assert all(cs.valid(cfg, k, p)[0] for k in cs.all_knobs(cfg))
    assert not cs.valid(cs.CutlassConfig(), cs.Knobs(), GemmProblem(128, 128, 64, acc="fp16"))[0]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(cs.all_configs()), st.integers(0, 10_000))
def test_names_round_trip(cfg, i):
    knobs = cs.all_knobs(cfg)
    k = knobs[i % len(knobs)]
    assert cs.CutlassConfig.parse(str(cfg)) == cfg
    assert cs.Knobs.parse(str(k)) == k
    assert cs.parse_name(f"{cfg}:{k}") == (cfg, k)


def test_swap_names_and_tiles():
    """A swapped config is its own name; its BM runs along our N (160 rows of C along M, as cuBLASLt's 128x160)."""
    cfg = cs.CutlassConfig(128, 160, 64, 2, 1, swap=True)
    assert str(cfg) == "coop_128x160x64_c2x1_persistent_tn_fp16_swap"
    assert cs.CutlassConfig.parse(str(cfg)) == cfg and cs.CutlassConfig.parse(str(replace(cfg, swap=False))) != cfg
    assert cfg.tiles(12288, 4096) == 77 * 32 and replace(cfg, swap=False).tiles(12288, 4096) == 96 * 26
    assert cs.valid_config(cfg)[0] and cs.valid_config(replace(cfg, bn=176))[0]
    assert not cs.valid_config(replace(cfg, bn=168, cm=1))[0]  # wgmma takes it, CuTe's smem partition does not
    assert not cs.valid_config(replace(cfg, bn=164))[0] and not cs.valid_config(replace(cfg, bn=272))[0]
    # narrow BN either way: rows of a decode call (swapped) or columns of a skinny output (cuBLASLt's 64x8 c2x4)
    assert all(cs.valid_config(replace(cfg, bn=bn, cm=1, swap=sw))[0] for bn in (8, 16, 32) for sw in (False, True))
    # a 4-CTA multicast of a 48-row B tile gives each CTA 12 rows: not a whole 8-row swizzle atom, nor part of one
    assert cs.valid_config(replace(cfg, bn=8, cm=2))[0]
    ok, why = cs.valid_config(replace(cfg, bm=128, bn=48, cm=4))
    assert not ok and "multicast slice" in why
    assert any(c.swap for c in cs.all_configs()) and any(c.bn == 160 for c in cs.all_configs())
    assert {c.epi_n for c in cs.all_configs()} == set(cs.EPI_NS)


def test_swap_costmodel_sees_the_swapped_tile():
    from gemmrl.search.costmodel import estimate_cutlass

    p = GemmProblem(64, 16384, 4096)  # 64 rows: 128-row tiles waste half their MMA (256 of them: 2 waves) unless along N
    plain, swapped = cs.CutlassConfig(128, 64, 64), cs.CutlassConfig(128, 64, 64, swap=True)
    assert estimate_cutlass(swapped, cs.Knobs(), p).seconds < estimate_cutlass(plain, cs.Knobs(), p).seconds


def test_screen_config_list():
    from pathlib import Path

    from gemmrl.search.screen import ScreenSpec, cutlass_configs

    extra = "coop_128x160x64_c1x1_persistent_tn_fp16_swap"
    assert cs.CutlassConfig.parse(extra) not in cs.family()
    got = cutlass_configs(["family", extra, "family"], "nn", "bf16")  # duplicates dropped
    assert len(got) == len(cs.family()) + 1 and all((c.layout, c.dtype) == ("nn", "bf16") for c in got)
    assert got[-1].swap and got[-1].bn == 160 and got[-1].cm == 1
    ScreenSpec(problems=(GemmProblem(64, 64, 64),), out=Path("x.csv"), family="cutlass",
               configs=("coop_128x160x64_c2x1_persistent_tn_fp16_swap",))
    p = GemmProblem(8192, 8192, 1024)
    few = cs.screen_entries(p, [cs.CutlassConfig()])
    every = cs.screen_entries(p, [cs.CutlassConfig()], all_knob_settings=True)
    assert set(few) < set(every) and len(every) == 18 and {k.raster for _, k in every} == set(cs.RASTERS)
    with pytest.raises(ValueError, match="cutlass family"):
        ScreenSpec(problems=(p,), out=Path("x.csv"), all_knobs=True)
    for configs, family, match in [(("coop_128x160",), "cutlass", "cannot read"),
                                   (("coop_64x128x64_c1x1_persistent_tn_fp16",), "cutlass", "BM=64"),
                                   (("family",), "triton", "Triton config 'family': cannot parse"),
                                   (("family",), "wgmma", "cutlass or triton family")]:
        with pytest.raises(ValueError, match=match):
            ScreenSpec(problems=(GemmProblem(64, 64, 64),), out=Path("x.csv"), family=family, configs=configs)


@pytest.mark.parametrize("text", ["coop_128x128", "coop_128x128x64_c1x1_persistent_tn", "x:y",
                                  "coop_128x128x64_c1x1_persistent_tn_fp16_swapped"])
def test_bad_names(text):
    with pytest.raises(cs.CutlassConfigError):
        cs.parse_name(text)


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (64, 64, 64), (128, 128, 16384), (8192, 8192, 8192)])
def test_knobs_for_are_valid(shape):
    p = GemmProblem(*shape)
    for cfg in cs.family():
        ks = cs.knobs_for(cfg, p)
        if not ks:  # only a tile under 64x64 on a grid of more than TINY_WAVES waves of tiles is left out
            assert cfg.bm * cfg.bn < cs.TINY_TILE and cfg.tiles(p.M, p.N) > cs.TINY_WAVES * 132
            continue
        assert ks[0] == cs.Knobs()
        assert all(cs.valid(cfg, k, p)[0] for k in ks)
    assert any(k.decomposition == "splitk" for k in cs.knobs_for(cs.CutlassConfig(scheduler="streamk"),
                                                                 GemmProblem(128, 128, 16384)))
    entries = cs.screen_entries(p, cs.family())
    assert len(entries) >= len(cs.family())


@pytest.mark.parametrize("shape,screened", [((64, 256, 256), True), ((1, 128256, 4096), True),
                                            ((32, 128256, 4096), True), ((4096, 4096, 4096), False)])
def test_tiny_tiles_screened_on_small_grids_only(shape, screened):
    """A tile under 64x64 (cuBLASLt's small-class picks, the decode tiles) is screened where the grid of its tiles is
    at most 32 waves: the small class and decode up to N = 128256 (swapped: 16 rows along M), not a 4096^3 cube (16384
    tiles of 64x16)."""
    p = GemmProblem(*shape)
    tiny = [c for c in cs.family() if c.bm * c.bn < cs.TINY_TILE and c.bn == 16 and c.swap]  # 16 rows along M
    assert tiny and all(bool(cs.knobs_for(c, p)) is screened for c in tiny)
    assert cs.knobs_for(cs.CutlassConfig(), p)  # the rest always are


@pytest.mark.parametrize("shape,splits", [((512, 256, 2048), {2, 4, 8, 16}), ((64, 64, 16384), {2, 4, 8, 16}),
                                          ((1024, 1024, 4096), {2, 4}), ((2048, 2048, 1024), set()),
                                          ((128, 128, 128), {2})])
def test_few_tiles_long_k_screen_more_splits(shape, splits):
    """Split-K beyond 4 while tiles x splits stays within 2 waves, never more splits than K tiles, none at all with
    as many tiles as SMs."""
    cfg = cs.CutlassConfig(128, 64, 64, scheduler="streamk")
    got = {k.splits for k in cs.knobs_for(cfg, GemmProblem(*shape)) if k.decomposition == "splitk"}
    assert got == splits


def test_rendering_flags():
    cfg = cs.CutlassConfig(256, 128, 64, 2, 1, "coop", "streamk", "nn", "bf16")
    src = cfg.source()
    assert set(cfg.flags()) == {"-DGEMMRL_BF16=1", "-DGEMMRL_B_ROW=1", "-DGEMMRL_BM=256", "-DGEMMRL_BN=128",
                                "-DGEMMRL_BK=64", "-DGEMMRL_CM=2", "-DGEMMRL_CN=1", "-DGEMMRL_PINGPONG=0",
                                "-DGEMMRL_STREAMK=1", "-DGEMMRL_SWAP=0"}
    assert "-DGEMMRL_SWAP=1" in replace(cfg, swap=True).flags()
    nosmem = cs.CutlassConfig(64, 64, 128, 1, 1, "pingpong", epilogue="nosmem")
    assert "-DGEMMRL_EPI_NOSMEM=1" in nosmem.flags() and not any("NOSMEM" in f for f in cfg.flags())
    assert str(nosmem).endswith("_nosmem") and cs.CutlassConfig.parse(str(nosmem)) == nosmem
    assert cs.CutlassConfig.parse(str(replace(nosmem, swap=True))).swap  # suffixes in the order _swap_nosmem
    # without the epilogue's shared memory more stages fit (capped at MAX_STAGES)
    assert replace(nosmem, bm=128, bn=128, bk=64).stages == 7 and replace(nosmem, bm=128, bn=128, bk=64, epilogue="tma").stages == 6
    # the TMA epilogue's subtile width: a flag, a name suffix after the others, and its shared memory out of the ring's
    wide = cs.CutlassConfig(128, 128, 64, 1, 2, epi_n=128)
    assert "-DGEMMRL_EPI_N=128" in wide.flags() and not any("EPI_N" in f for f in cfg.flags())
    assert str(wide) == "coop_128x128x64_c1x2_persistent_tn_fp16_e128" and cs.CutlassConfig.parse(str(wide)) == wide
    assert cs.CutlassConfig.parse(str(replace(wide, swap=True, epi_n=64))) == replace(wide, swap=True, epi_n=64)
    assert [replace(wide, epi_n=e).epilogue_bytes for e in (0, 64, 128)] == [16384, 32768, 65536]
    assert [replace(wide, epi_n=e).stages for e in (0, 64, 128)] == [6, 6, 5]
    pp = cs.CutlassConfig(64, 192, 64, 1, 1, "pingpong", epi_n=64)  # 64 rows x 64: two 8 KiB subtiles
    assert pp.epilogue_bytes == 16384 and pp.stages == replace(pp, epi_n=0).stages
    assert replace(nosmem, epi_n=0).epilogue_bytes == 0
    # a 160-wide tile needs CuTe's extended wgmma shapes, or it runs 64x32 atoms (the swapped-CUTLASS run's ncu)
    assert "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED" in replace(cfg, bn=160).flags()
    assert src.layout == "nn" and src.dtype == "bf16" and src.includes == ("cutlass",)
    assert "gemmrl_cutlass_gemm" in src.code and src.shapes.admits(1, 8, 8) and not src.shapes.admits(1, 12, 8)
    # one template for every config: the sources differ only in their flags
    assert cs.CutlassConfig().source().code == src.code


def test_selection_round_trip(tmp_path):
    from gemmrl.results import ResultsWriter
    from gemmrl.search.selection import load_selection, selected_candidates

    rows = []
    for mnk, proto, algo, t in [("64_64_64", "graph", "coop_128x128x64_c1x1_persistent_tn_fp16:s1_rh_dheuristic_k1", 2.0),
                                ("64_64_64", "graph", "pingpong_64x64x128_c1x1_persistent_tn_fp16:s1_rh_dheuristic_k1", 1.0),
                                ("64_64_64", "cold", "coop_128x128x64_c1x1_persistent_tn_fp16:s1_rh_dheuristic_k1", 3.0)]:
        rows.append({"mnk": mnk, "dtype": "fp16", "acc": "fp32", "protocol": proto, "layout": "tn",
                     "candidate": f"cutlass:{algo}", "algo": algo, "verified": True, "time_ms": t,
                     "tflops": 1.0 / t, "info": "screen"})
    w = ResultsWriter(tmp_path / "sel.csv")
    w.write_batch(rows)
    sel = load_selection([tmp_path / "sel.csv"], "cutlass")
    assert sel["64_64_64"]["graph"][0].startswith("pingpong_64x64x128")
    cands = selected_candidates(GemmProblem(64, 64, 64), sel, "cutlass")
    assert sorted(c.name for c in cands) == ["cutlass-sel:cold", "cutlass-sel:graph"]


@pytest.mark.skipif(not have_cutlass_toolchain(), reason="needs nvcc and the nvidia-cutlass headers")
def test_one_config_compiles_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", os.environ.get("GEMMRL_TEST_CUTLASS_CACHE", str(tmp_path)))
    for cfg in (cs.CutlassConfig(64, 64, 128, 1, 1, "pingpong"), cs.CutlassConfig(128, 160, 64, 2, 1, swap=True),
                cs.CutlassConfig(64, 16, 64, 2, 4, "pingpong", epilogue="nosmem"),
                cs.CutlassConfig(64, 192, 64, 1, 1, "pingpong", epi_n=64)):
        b = cs.build_config(cfg, "90a")
        assert b.ok, b.error
        assert b.ptxas.spill_store_bytes == 0 and b.ptxas.max_registers > 0
        assert not any("C7510" in w for w in b.ptxas.perf_warnings)  # wgmma not serialized


def test_hot_plan_needs_prepare():
    with pytest.raises(cs.CutlassConfigError, match="before prepare"):
        cs.CutlassCandidate(cs.CutlassConfig()).hot_plan()


class _FakePlanLib:
    """The entry points prepare() and a call use, recording what they were given (no CUDA, no build)."""

    def __init__(self, rc: int = 0):
        self.rc, self.plans, self.runs = rc, [], []
        self.gemmrl_cutlass_plan_run = self._run

    def gemmrl_cutlass_can_implement(self, *args):
        return 0

    def gemmrl_cutlass_workspace(self, *args):
        return 0

    def gemmrl_cutlass_plan(self, *args):
        self.plans.append(args)
        return 4096 + len(self.plans)

    def gemmrl_cutlass_plan_free(self, plan):
        pass

    def _run(self, *args):
        self.runs.append(args)
        return self.rc


@pytest.mark.parametrize("layout", ["tn", "nn"])
@pytest.mark.parametrize("mnk", ["33_65_129", "128_256_64"])
def test_call_goes_through_the_prepared_plan(monkeypatch, layout, mnk):
    """A bench call passes the plan, the operands and the stream (5 ctypes arguments, as the vendor's cuBLASLt plans
    do), not gemmrl_cutlass_gemm's 16: host-timed protocols (offline, server) time CUTLASS and cuBLASLt alike."""
    from gemmrl.candidate import make_buffers
    from gemmrl.problem import parse_mnk

    fake = _FakePlanLib()
    cand = cs.CutlassCandidate(cs.CutlassConfig(layout=layout))
    monkeypatch.setattr(cs, "check", lambda *a: None)
    monkeypatch.setattr(cs, "_cc", lambda device: 90)

    def load(device):
        cand._lib = fake  # what _load does, less the build (and its refusal of CPU tensors)
        return fake

    monkeypatch.setattr(cand, "_load", load)
    monkeypatch.setattr(cs, "raw_stream_getter", lambda: (lambda index: 77))
    problem = parse_mnk(mnk).with_(layout=layout)
    bufs = make_buffers(problem, "cpu")
    cand.prepare(problem, bufs, "offline", None)
    M, N, K = problem.M, problem.N, problem.K
    assert fake.plans == [(M, N, K, K, K if layout == "tn" else N, N, 0, 0, *cs.Knobs().args())]
    a, b, bt, c = bufs.args()
    cand(a, b, bt, c)
    cand(a, b, bt, c)
    plan = 4097
    want = (plan, a.data_ptr(), (bt if layout == "tn" else b).data_ptr(), c.data_ptr(), 77)
    assert fake.runs == [want, want]
    assert len(fake.plans) == 1  # made once per prepare, not per call
    fake.rc = 4
    with pytest.raises(RuntimeError, match=f"returned 4 for {mnk}"):
        cand(a, b, bt, c)


@pytest.mark.skipif(not have_cutlass_toolchain(), reason="needs nvcc and the nvidia-cutlass headers")
def test_plan_entry_points_host_only(tmp_path, monkeypatch):
    """The plan the compiled hot path calls: made and freed on the host; a NULL plan is refused (code 5) before any
    CUDA call, so this runs without a GPU."""
    import ctypes

    from gemmrl.kernels.cuda_source import load_library

    monkeypatch.setenv("GEMMRL_CACHE_DIR", os.environ.get("GEMMRL_TEST_CUTLASS_CACHE", str(tmp_path)))
    b = cs.build_config(cs.CutlassConfig(64, 64, 128, 1, 1, "pingpong"), "90a")
    assert b.ok, b.error
    lib = load_library(b.so)
    lib.gemmrl_cutlass_plan.restype = ctypes.c_void_p
    lib.gemmrl_cutlass_plan.argtypes = [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 4
    lib.gemmrl_cutlass_plan_run.restype = ctypes.c_int
    lib.gemmrl_cutlass_plan_run.argtypes = [ctypes.c_void_p] * 5
    lib.gemmrl_cutlass_plan_free.argtypes = [ctypes.c_void_p]
    plan = lib.gemmrl_cutlass_plan(64, 64, 128, 128, 128, 64, None, 0, 1, 0, 0, 1)
    assert plan
    assert lib.gemmrl_cutlass_plan_run(None, None, None, None, None) == 5
    lib.gemmrl_cutlass_plan_free(plan)


# -- GPU ------------------------------------------------------------------------------------------------------
GPU_CONFIGS = [cs.CutlassConfig(), cs.CutlassConfig(64, 128, 64, 1, 1, "pingpong"),
               cs.CutlassConfig(128, 128, 64, 2, 1), cs.CutlassConfig(scheduler="streamk"),
               cs.CutlassConfig(128, 160, 64, 2, 1, swap=True), cs.CutlassConfig(64, 256, 64, 1, 1, "pingpong", swap=True),
               cs.CutlassConfig(128, 128, 64, 1, 2, layout="nn", swap=True),
               cs.CutlassConfig(64, 16, 128, 1, 1, "pingpong", swap=True),
               cs.CutlassConfig(64, 8, 64, 2, 4, "pingpong", swap=True), cs.CutlassConfig(64, 32, 64, 2, 4, "pingpong"),
               cs.CutlassConfig(64, 16, 64, 2, 4, "pingpong", epilogue="nosmem"),
               cs.CutlassConfig(64, 32, 64, 1, 2, "pingpong", swap=True, epilogue="nosmem"),
               cs.CutlassConfig(64, 192, 64, 1, 1, "pingpong", epi_n=64), cs.CutlassConfig(128, 128, 64, 1, 2, epi_n=128),
               # the widest ping-pong tile with 2-CTA multicast (the 168-wide-tile run): B's 256 rows split over 2 CTAs, and swapped
               cs.CutlassConfig(64, 256, 64, 2, 1, "pingpong"), cs.CutlassConfig(64, 256, 64, 1, 2, "pingpong", swap=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", GPU_CONFIGS, ids=str)
@pytest.mark.parametrize("shape", [(1, 8, 8), (33, 72, 136), (256, 512, 1024), (64, 4096, 4096)])
def test_configs_pass_battery(cfg, shape):
    from gemmrl.candidate import make_buffers
    from gemmrl.kernels.cuda_source import graph_safety
    from gemmrl.verify import verify

    p = GemmProblem(*shape, layout=cfg.layout)
    knobs = cs.knobs_for(cfg, p)[-1]
    cand = cs.CutlassCandidate(cfg, knobs)
    bufs = make_buffers(p, "cuda")
    cand.prepare(p, bufs, "graph", None)
    v = verify(cand, p, "cuda")
    assert v.passed, (str(knobs), v.reason)
    ok, why = graph_safety(cand, bufs)
    assert ok, why


# Swizzles past CUTLASS's cap of 8 (the template's widen_swizzle): shapes whose swizzled dimension is and is not a
# multiple of the swizzle (padded tiles computed on zeros and clipped), both raster orders, a cluster and a swap.
WIDE_CONFIGS = [cs.CutlassConfig(64, 256, 64, 1, 1, "pingpong"), cs.CutlassConfig(128, 256, 64, 2, 1),
                cs.CutlassConfig(128, 128, 64, 1, 2, swap=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", WIDE_CONFIGS, ids=str)
@pytest.mark.parametrize("shape", [(33, 72, 136), (1000, 1496, 256), (2048, 4096, 512)])
def test_wide_swizzle_matches_swizzle_1(cfg, shape):
    """Each tile's K loop is the same whatever the tile order, so a wide swizzle must write exactly what swizzle 1
    writes, and pass the battery."""
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.verify import verify

    p = GemmProblem(*shape, layout=cfg.layout)
    bufs = make_buffers(p, "cuda")
    base = cs.CutlassCandidate(cfg, cs.Knobs())
    base.prepare(p, bufs, "graph", None)
    base(bufs.a, bufs.b, bufs.bt, bufs.c)
    want = bufs.c.clone()
    for knobs in (cs.Knobs(16, "n"), cs.Knobs(16, "m"), cs.Knobs(32, "n"), cs.Knobs(32, "m")):
        cand = cs.CutlassCandidate(cfg, knobs)
        cand.prepare(p, bufs, "graph", None)
        bufs.c.fill_(float("nan"))
        cand(bufs.a, bufs.b, bufs.bt, bufs.c)
        torch.cuda.synchronize()
        assert torch.equal(bufs.c, want), str(knobs)
        v = verify(cand, p, "cuda")
        assert v.passed, (str(knobs), v.reason)
