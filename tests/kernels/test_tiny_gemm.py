"""The small-tile mma.sync family with the one-launch cluster/DSMEM split-K (kernels/tiny_gemm.py,
csrc/tiny_splitk.cu).

CPU tier: names, the validity predicates, the screened configs, the selection reader, and (where nvcc exists) one
build per dtype with no spills whose host-side shared-memory sizes match the predicate's. GPU tier: every tile and
split through the battery and graph capture on odd, tiny and few-tile long-K shapes, both dtypes; the split
bit-for-bit deterministic over repeated calls and graph replays."""

import dataclasses

import pytest

from gemmrl.kernels import cuda_source as cs
from gemmrl.kernels import toolchain
from gemmrl.kernels import tiny_gemm as tg
from gemmrl.problem import GemmProblem

needs_nvcc = pytest.mark.skipif(not toolchain.find_nvcc(), reason="needs nvcc (the CUDA toolkit) to compile")


@pytest.mark.parametrize("cfg", [tg.TinyConfig(), tg.TinyConfig(16, 32, 16, 2, "bf16"), tg.TinyConfig(128, 128, 8, 4),
                                 tg.TinyConfig(16, 32, 8, 4, kw=2), tg.TinyConfig(32, 32, 1, 8, "bf16", 4),
                                 tg.TinyConfig(128, 128, 1, 2, staged=True), tg.TinyConfig(64, 64, 1, 4, kw=2, staged=True)],
                         ids=str)
def test_name_round_trip(cfg):
    assert tg.TinyConfig.parse(str(cfg)) == cfg


def test_names_of_one_k_group_are_the_first_tiny_names():
    """Library entries and selections written before the sliced-K tiles keep their meaning."""
    assert str(tg.TinyConfig(32, 32, 16, 8)) == "32x32_s16_st8_fp16"
    assert tg.TinyConfig.parse("32x32_s16_st8_fp16").kw == 1
    assert str(tg.TinyConfig(32, 32, 16, 8, kw=2)) == "32x32_kw2_s16_st8_fp16"
    assert str(tg.TinyConfig(64, 64, 1, 2, staged=True)) == "64x64_s1_st2_es_fp16"
    assert not tg.TinyConfig.parse("64x64_s1_st2_fp16").staged


@pytest.mark.parametrize("text", ["64x64_s1_fp16", "64x64_s1_st4_fp32", "64x64_s1_st4", "", "64x64_kw_s1_st4_fp16"])
def test_bad_names_say_what_to_write(text):
    with pytest.raises(tg.TinyConfigError, match="expected e.g."):
        tg.TinyConfig.parse(text)


@pytest.mark.parametrize("cfg,why", [
    (tg.TinyConfig(48, 64), "tile 48x64"), (tg.TinyConfig(64, 256), "tile 64x256"), (tg.TinyConfig(64, 64, 3), "split 3"),
    (tg.TinyConfig(64, 64, 32), "split 32"), (tg.TinyConfig(64, 64, 1, 3), "stages 3"),
    (tg.TinyConfig(128, 128, 1, 8), "shared memory"), (tg.TinyConfig(128, 128, 1, 4, kw=2), "2 K groups"),
    (tg.TinyConfig(16, 64, 1, 4, kw=4), "4 K groups"),
    (tg.TinyConfig(64, 64, 1, 4, "fp8"), "dtype"), (tg.TinyConfig(64, 64, 2, 4, staged=True), "split 1's epilogue")])
def test_valid_config_rejects_with_reason(cfg, why):
    ok, msg = tg.valid_config(cfg)
    assert not ok and why in msg


def test_space_counts_every_instantiation():
    cfgs = tg.all_configs()
    assert len(cfgs) == tg.space_size() and len(set(cfgs)) == len(cfgs)
    assert all(c.smem_bytes <= tg.SMEM_LIMIT for c in cfgs)
    # every instantiation but the 8-deep rings of 128 x 128 (295 KB), and of 64 x 128 and 128 x 64 with a split (221 KB
    # of ring and 33 KB of pushed partials), in both dtypes
    # (and a staged twin of every unsplit one)
    unsplit = len(tg.TILES) * len(tg.STAGES) - 1  # (no 8-deep ring of 128 x 128)
    assert len(cfgs) == (len(tg.TILES) * len(tg.STAGES) * len(tg.SPLITS) - 5 - 2 * 4 + unsplit) * len(tg.DTYPES)
    assert all(c.split == 1 for c in cfgs if c.staged) and sum(c.staged for c in cfgs) == unsplit * len(tg.DTYPES)
    assert not tg.valid_config(tg.TinyConfig(128, 128, 1, 8))[0]
    assert not tg.valid_config(tg.TinyConfig(64, 128, 2, 8))[0]
    assert tg.valid_config(tg.TinyConfig(64, 128, 1, 8))[0]
    # the ring of 2 x (64 + 64) rows of 72 halves; a split adds the region its cluster pushes partials into (64 x 68
    # floats) and the 8-byte mbarrier they complete on
    assert tg.TinyConfig(64, 64, 1, 2).smem_bytes == 2 * 128 * 72 * 2
    assert tg.TinyConfig(64, 64, 8, 2).smem_bytes == 2 * 128 * 72 * 2 + 64 * 68 * 4 + 8
    assert {c.threads for c in cfgs} == {64, 128, 256, 512}
    assert tg.TinyConfig(16, 32, kw=2).threads == 128 and tg.TinyConfig(32, 32, kw=4).threads == 512


@pytest.mark.parametrize("problem,why", [
    (GemmProblem(64, 64, 1024, layout="nn"), "layout tn"), (GemmProblem(64, 64, 1024, acc="fp16"), "fp32"),
    (GemmProblem(64, 64, 1028), "K % 8"), (GemmProblem(64, 64, 1024, dtype="bf16"), "dtype"),
    (GemmProblem(64, 64, 192), "K steps"), (GemmProblem(4096, 4096, 4096), "few-tile")])
def test_valid_at_problem_rejects_with_reason(problem, why):
    cfg = tg.TinyConfig(64, 64, 4)
    ok, msg = tg.valid(cfg, problem)
    assert not ok and why in msg, msg
    with pytest.raises(tg.TinyConfigError):
        tg.check(cfg, problem)


def test_valid_needs_hopper_and_allows_unsplit_anywhere():
    ok, msg = tg.valid(tg.TinyConfig(), GemmProblem(64, 64, 64), cc=80)
    assert not ok and "sm_90a" in msg
    assert tg.valid(tg.TinyConfig(64, 64, 1), GemmProblem(4096, 4096, 4096))[0]


@pytest.mark.parametrize("shape", [(1, 7, 16), (33, 65, 136), (64, 64, 64), (130, 200, 72), (3, 4096, 40),
                                   (64, 64, 1024), (512, 256, 2048), (64, 64, 16384), (256, 256, 4096)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_screen_configs_are_valid_and_fit_the_shape(shape, dtype):
    p = GemmProblem(*shape, dtype=dtype)
    cfgs = tg.screen_configs(p)
    assert cfgs and all(tg.valid(c, p)[0] for c in cfgs) and all(c.dtype == dtype for c in cfgs)
    assert len(set(cfgs)) == len(cfgs)
    assert all(c.split == 1 or tg.tiles(c, p) * c.split <= 132 for c in cfgs)  # splits fit one wave
    assert any(c.split == 1 for c in cfgs)
    if p.M <= 16:
        assert {c.bm for c in cfgs} == {16}
    # no ring deeper than a CTA's K steps need
    for c in cfgs:
        steps = -(-tg.ktiles(p) // c.split)
        deep = tg.valid_config(dataclasses.replace(c, stages=8))[0]
        assert c.stages == (8 if steps >= 8 and deep else 4 if steps > 2 else 2), str(c)


def test_screen_configs_split_the_few_tile_long_k_shapes():
    p = GemmProblem(64, 64, 1024)
    splits = {c.split for c in tg.screen_configs(p) if (c.bm, c.bn) == (64, 64)}
    assert splits == {1, 4, 8, 16}  # one tile: the three deepest splits that fit one wave, and none


def test_screen_configs_stage_c_where_tiles_fill_half_a_wave():
    many = tg.screen_configs(GemmProblem(2048, 2048, 64))
    assert {c.split for c in many} == {1} and any(c.staged for c in many)
    assert {dataclasses.replace(c, staged=False) for c in many if c.staged} <= set(many)  # twins of screened configs
    assert not any(c.staged for c in tg.screen_configs(GemmProblem(64, 64, 1024)))  # one tile: its split's ground


def test_screen_configs_empty_for_odd_k():
    assert tg.screen_configs(GemmProblem(33, 65, 129)) == []


def test_selection_round_trip(tmp_path):
    from gemmrl.results import ResultsWriter
    from gemmrl.search.selection import load_selection, selected_candidates

    rows = [{"mnk": "64_64_1024", "protocol": p, "candidate": f"tiny:{c}", "algo": str(c), "time_ms": t,
             "verified": True, "floor_ok": True, "layout": "tn", "dtype": "fp16", "acc": "fp32"}
            for p, c, t in (("graph", tg.TinyConfig(64, 64, 8, 2), 0.002), ("graph", tg.TinyConfig(32, 32, 4), 0.003),
                            ("cold", tg.TinyConfig(32, 32, 4), 0.004))]
    path = tmp_path / "sel.csv"
    ResultsWriter(path).write_batch(rows)
    sel = load_selection([path], "tiny")
    assert sel == {"64_64_1024": {"graph": ("64x64_s8_st2_fp16", "tn"), "cold": ("32x32_s4_st4_fp16", "tn")}}
    cands = selected_candidates(GemmProblem(64, 64, 1024), sel, "tiny")
    assert sorted(c.name for c in cands) == ["tiny-sel:cold", "tiny-sel:graph"]
    assert selected_candidates(GemmProblem(64, 64, 1024, dtype="bf16"), sel, "tiny") == []


def test_screen_spec_takes_the_family(tmp_path):
    from gemmrl.kernels.registry import family
    from gemmrl.search.screen import SCREENS, ScreenSpec

    assert "tiny" in SCREENS and family("tiny").prefix == tg.PREFIX
    ScreenSpec(problems=(GemmProblem(64, 64, 1024),), out=tmp_path / "x.csv", family="tiny")
    with pytest.raises(ValueError, match="cutlass or triton"):
        ScreenSpec(problems=(GemmProblem(64, 64, 1024),), out=tmp_path / "x.csv", family="tiny", configs=("a",))


@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_builds_without_spills_and_sizes_agree(dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    tg._BUILT.clear()
    b = tg.build_dtype(dtype, "90a")
    # every tile x split x ring, and the staged-C twin of every unsplit one
    assert b.ptxas.kernels == len(tg.TILES) * (len(tg.SPLITS) + 1) * len(tg.STAGES)
    assert b.ptxas.spill_store_bytes == 0 and b.ptxas.max_registers <= 255
    lib = tg.typed(cs.load_library(b.so))  # host code only below: no GPU needed
    for c in tg.all_configs([dtype]):
        assert lib.gemmrl_tiny_smem_bytes(c.bm, c.bn, c.split, c.stages, c.kw) == c.smem_bytes, str(c)
    assert lib.gemmrl_tiny_smem_bytes(48, 64, 1, 4, 1) == -1 and lib.gemmrl_tiny_smem_bytes(64, 64, 3, 4, 1) == -1
    assert lib.gemmrl_tiny_smem_bytes(128, 128, 1, 4, 2) == -1 and lib.gemmrl_tiny_smem_bytes(16, 32, 1, 4, 3) == -1
    tg._BUILT.clear()


@pytest.mark.gpu
def test_plans_refuse_what_the_kernel_does_not_take():
    import torch

    torch.cuda.init()
    lib = tg.typed(cs.load_library(tg.build_dtype("fp16").so))
    plan = lib.gemmrl_tiny_plan(64, 64, 1024, 1024, 1024, 64, 64, 64, 8, 4, 1, 0)
    assert plan
    lib.gemmrl_tiny_plan_free(plan)
    assert not lib.gemmrl_tiny_plan(64, 64, 1028, 1028, 1028, 64, 64, 64, 8, 4, 1, 0)     # K % 8
    assert not lib.gemmrl_tiny_plan(64, 64, 128, 128, 128, 64, 64, 64, 4, 4, 1, 0)        # split > K steps
    assert not lib.gemmrl_tiny_plan(64, 64, 1024, 1024, 1024, 64, 48, 64, 1, 4, 1, 0)     # no such tile
    assert not lib.gemmrl_tiny_plan(64, 64, 1024, 1024, 1024, 64, 128, 128, 1, 4, 2, 0)   # no such K grouping
    assert not lib.gemmrl_tiny_plan(64, 64, 1024, 1024, 1024, 64, 64, 64, 8, 4, 1, 1)     # staged with a split
    assert lib.gemmrl_tiny_max_active_clusters(64, 64, 16, 4, 1) >= 1
    assert lib.gemmrl_tiny_max_active_clusters(32, 32, 16, 8, 4) >= 1


# -- GPU ------------------------------------------------------------------------------------------------------
GPU_CASES = [
    ((1, 8, 8), tg.TinyConfig(16, 32, 1, 2)), ((33, 65, 136), tg.TinyConfig(16, 64, 2, 2)),
    ((33, 65, 136), tg.TinyConfig(32, 32, 1, 4)), ((129, 257, 4104), tg.TinyConfig(64, 64, 16, 4)),
    ((129, 257, 4104), tg.TinyConfig(32, 64, 8, 2)), ((300, 1000, 64), tg.TinyConfig(128, 128, 1, 2)),
    ((512, 256, 2048), tg.TinyConfig(128, 64, 8, 4)), ((128, 136, 8192), tg.TinyConfig(64, 128, 16, 4)),
    ((64, 64, 16384), tg.TinyConfig(64, 64, 16, 4)), ((1024, 256, 4096), tg.TinyConfig(128, 128, 2, 4)),
    ((3, 4096, 40), tg.TinyConfig(16, 64, 1, 2)), ((16, 4096, 4096), tg.TinyConfig(16, 64, 2, 4)),
    ((200, 72, 1000), tg.TinyConfig(64, 32, 16, 2)), ((64, 64, 1024), tg.TinyConfig(64, 64, 8, 2)),
    ((255, 129, 520), tg.TinyConfig(32, 32, 4, 4)),  # a K slice that ends mid-step, tails in M and N
    ((64, 64, 16384), tg.TinyConfig(32, 32, 16, 8)), ((129, 257, 4104), tg.TinyConfig(64, 64, 1, 8)),  # 8-deep rings
    ((200, 72, 1000), tg.TinyConfig(128, 64, 1, 8)), ((200, 72, 1000), tg.TinyConfig(64, 64, 2, 8)),
    # sliced K (KW groups of warps split each step), unsplit and split, ragged loads (16x64 over 256 threads)
    ((1, 8, 8), tg.TinyConfig(16, 32, 1, 2, kw=4)), ((33, 65, 136), tg.TinyConfig(16, 64, 2, 2, kw=2)),
    ((255, 129, 520), tg.TinyConfig(32, 32, 4, 4, kw=4)), ((64, 64, 16384), tg.TinyConfig(32, 32, 16, 8, kw=2)),
    ((129, 257, 4104), tg.TinyConfig(64, 64, 1, 8, kw=2)), ((200, 72, 1000), tg.TinyConfig(64, 32, 16, 2, kw=2)),
    ((64, 64, 4096), tg.TinyConfig(16, 32, 8, 4, kw=2)), ((3, 4096, 40), tg.TinyConfig(32, 64, 1, 2, kw=2)),
    # C staged through shared memory: tails in M and N (N % 8 != 0: the element-wise tail), sliced K, a one-step K
    ((300, 1000, 64), tg.TinyConfig(128, 128, 1, 2, staged=True)),
    ((33, 65, 136), tg.TinyConfig(32, 32, 1, 4, staged=True)),
    ((129, 257, 4104), tg.TinyConfig(64, 64, 1, 8, kw=2, staged=True)),
    ((1, 8, 8), tg.TinyConfig(16, 32, 1, 2, staged=True)),
    ((2048, 2048, 64), tg.TinyConfig(64, 64, 1, 2, staged=True)),
    ((255, 129, 520), tg.TinyConfig(16, 64, 1, 4, kw=2, staged=True)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape,cfg", GPU_CASES, ids=lambda x: str(x) if isinstance(x, tg.TinyConfig) else
                         "_".join(map(str, x)))
def test_configs_pass_battery(shape, cfg, dtype):
    import dataclasses

    from gemmrl.candidate import make_buffers
    from gemmrl.verify import verify

    p = GemmProblem(*shape, layout="tn", dtype=dtype)
    cfg = dataclasses.replace(cfg, dtype=dtype)
    cand = tg.TinyCandidate(cfg)
    bufs = make_buffers(p, "cuda")
    cand.prepare(p, bufs, "graph", None)
    v = verify(cand, p, "cuda")
    assert v.passed, (str(cfg), v.reason)
    ok, why = cs.graph_safety(cand, bufs)
    assert ok, why


@pytest.mark.gpu
@pytest.mark.parametrize("shape,cfg", [((64, 64, 16384), tg.TinyConfig(64, 64, 16, 4)),
                                       ((200, 72, 1000), tg.TinyConfig(64, 32, 8, 2)),
                                       ((64, 64, 16384), tg.TinyConfig(32, 32, 16, 4, kw=4))], ids=str)
def test_split_is_deterministic(shape, cfg):
    """Repeated calls and graph replays give the same bits (the partials are summed in rank order)."""
    import torch

    from gemmrl.candidate import make_buffers

    p = GemmProblem(*shape, layout="tn")
    cand = tg.TinyCandidate(cfg)
    bufs = make_buffers(p, "cuda")
    cand.prepare(p, bufs, "graph", None)
    a, b, bt, c = bufs.args()
    cand(a, b, bt, c)
    first = c.clone()
    for _ in range(20):
        c.fill_(float("nan"))
        cand(a, b, bt, c)
        assert torch.equal(c, first)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        cand(a, b, bt, c)
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(10):
        c.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(c, first)
    ref = a.double() @ bt.double().T
    err = (first.double() - ref).abs().max().item()
    assert err <= 1e-2 * ref.abs().max().item() + 1e-3, err


@pytest.mark.gpu
def test_default_entry_serves_through_cuda_source():
    from conftest import assert_serves

    for shape in ((1, 8, 8), (512, 256, 2048), (64, 64, 16384), (33, 65, 136)):
        assert_serves(tg.source("fp16"), GemmProblem(*shape))
