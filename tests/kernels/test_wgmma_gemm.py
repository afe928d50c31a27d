"""The TMA + wgmma family with the cluster/DSMEM and global split-K reductions (kernels/wgmma_gemm.py,
csrc/wgmma_splitk.cu).

CPU tier: names, the validity predicates, the screened configs, and (where nvcc exists) one build per dtype with
no spills whose host-side shared-memory sizes match the predicate's. GPU tier: configs across WG, BN, split and
stages (global splits too) through the battery and graph capture on odd, tiny and few-tile long-K shapes, both
dtypes; the global split bit-for-bit deterministic over repeated calls and graph replays."""


import pytest

from gemmrl.kernels import cuda_source as cs
from gemmrl.kernels import toolchain
from gemmrl.kernels import wgmma_gemm as wg
from gemmrl.problem import GemmProblem

needs_nvcc = pytest.mark.skipif(not toolchain.find_nvcc(), reason="needs nvcc (the CUDA toolkit) to compile")


@pytest.mark.parametrize("cfg", [wg.WgmmaConfig(), wg.WgmmaConfig(2, 256, 16, 2, "bf16"), wg.WgmmaConfig(1, 64, 8, 8),
                                 wg.WgmmaConfig(1, 64, 1, 2, g=128), wg.WgmmaConfig(2, 128, 1, 4, "bf16", 8)], ids=str)
def test_name_round_trip(cfg):
    assert wg.WgmmaConfig.parse(str(cfg)) == cfg


def test_names_without_global_split_are_unchanged():
    # rows of earlier runs name configs without _g: they still read, as g = 1, and g = 1 prints without it
    assert wg.WgmmaConfig.parse("64x128_s4_st4_fp16") == wg.WgmmaConfig(1, 128, 4, 4)
    assert str(wg.WgmmaConfig(1, 64, 1, 3, g=16)) == "64x64_s1_g16_st3_fp16"
    assert str(wg.WgmmaConfig(1, 64, 1, 3)) == "64x64_s1_st3_fp16"


@pytest.mark.parametrize("text", ["96x128_s1_st4_fp16", "64x128_s1_fp16", "64x128_s1_st4_fp32", ""])
def test_bad_names_say_what_to_write(text):
    with pytest.raises(wg.WgmmaConfigError, match="expected e.g."):
        wg.WgmmaConfig.parse(text)


@pytest.mark.parametrize("cfg,why", [
    (wg.WgmmaConfig(3, 128), "BM 192"), (wg.WgmmaConfig(1, 96), "BN 96"), (wg.WgmmaConfig(1, 64, 3), "split 3"),
    (wg.WgmmaConfig(1, 64, 1, 1), "stages 1"), (wg.WgmmaConfig(1, 64, 1, 9), "stages 9"),
    (wg.WgmmaConfig(2, 256, 1, 8), "shared memory"), (wg.WgmmaConfig(1, 64, 1, 4, "fp8"), "dtype"),
    (wg.WgmmaConfig(1, 64, 1, 4, g=3), "global split g3"), (wg.WgmmaConfig(1, 64, 2, 4, g=2), "do not combine")])
def test_valid_config_rejects_with_reason(cfg, why):
    ok, msg = wg.valid_config(cfg)
    assert not ok and why in msg


def test_space_counts_every_instantiation():
    cfgs = wg.all_configs()
    assert len(cfgs) == wg.space_size() and len(set(cfgs)) == len(cfgs)
    assert {(c.wg, c.bn, c.split) for c in cfgs} == {(w, b, s) for w in wg.WGS for b in wg.BNS for s in wg.SPLITS}
    assert {c.g for c in cfgs} == set(wg.GSPLITS) and all(c.split == 1 for c in cfgs if c.g > 1)
    assert all(c.smem_bytes <= wg.SMEM_LIMIT for c in cfgs)
    # the largest tile's parked partial (128 x 264 floats) needs more than two stages of ring: it reuses the ring
    big = wg.WgmmaConfig(2, 256, 2, 2)
    assert big.smem_bytes == 128 * 264 * 4 + 1024 + 32


@pytest.mark.parametrize("problem,why", [
    (GemmProblem(64, 64, 64, layout="nn"), "layout tn"), (GemmProblem(64, 64, 64, acc="fp16"), "fp32"),
    (GemmProblem(64, 64, 68), "K % 8"), (GemmProblem(64, 64, 128, dtype="bf16"), "dtype"),
    (GemmProblem(64, 64, 128), "K tiles"), (GemmProblem(4096, 4096, 4096), "few-tile")])
def test_valid_at_problem_rejects_with_reason(problem, why):
    cfg = wg.WgmmaConfig(1, 64, 4)
    ok, msg = wg.valid(cfg, problem)
    assert not ok and why in msg, msg
    with pytest.raises(wg.WgmmaConfigError):
        wg.check(cfg, problem)


@pytest.mark.parametrize("cfg,shape,ok,why", [
    (wg.WgmmaConfig(1, 64, 1, 2, g=128), (64, 64, 16384), True, ""),
    (wg.WgmmaConfig(1, 64, 1, 2, g=128), (64, 128, 16384), False, "resident at once"),   # 2 tiles x 128 > 132
    (wg.WgmmaConfig(1, 64, 1, 2, g=64), (64, 128, 16384), True, ""),
    (wg.WgmmaConfig(1, 64, 1, 2, g=4), (64, 64, 192), False, "K tiles"),                 # 3 K tiles
    (wg.WgmmaConfig(2, 256, 1, 2, g=2), (4096, 4096, 4096), False, "resident at once")])
def test_valid_global_split(cfg, shape, ok, why):
    got, msg = wg.valid(cfg, GemmProblem(*shape))
    assert got == ok and why in msg, msg


def test_workspace_bytes():
    # 64_64: 1 tile, 256 bytes of barrier words, then 128 partials of 64 x 64 floats
    assert wg.WgmmaConfig(1, 64, 1, 2, g=128).workspace_bytes(64, 64) == 256 + 128 * 64 * 64 * 4
    # 33 tiles of 64 x 64 (3 x 11 with tails): 264 bytes of words round up to 512
    assert wg.WgmmaConfig(1, 64, 1, 2, g=4).workspace_bytes(129, 641) == 512 + 33 * 4 * 64 * 64 * 4
    assert wg.WgmmaConfig(1, 64, 4, 2).workspace_bytes(129, 641) == 0


def test_valid_needs_hopper():
    ok, msg = wg.valid(wg.WgmmaConfig(), GemmProblem(64, 64, 64), cc=80)
    assert not ok and "Hopper" in msg


@pytest.mark.parametrize("shape", [(1, 7, 16), (33, 65, 136), (64, 64, 64), (130, 200, 72), (3, 4096, 40),
                                   (512, 256, 2048), (64, 64, 16384), (4096, 4096, 4096)])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_screen_configs_are_valid_and_cover_splits(shape, dtype):
    p = GemmProblem(*shape, dtype=dtype)
    cfgs = wg.screen_configs(p)
    assert cfgs and all(wg.valid(c, p)[0] for c in cfgs) and all(c.dtype == dtype for c in cfgs)
    assert len(set(cfgs)) == len(cfgs)
    assert {c.split for c in cfgs} == {s for s in wg.SPLITS if any(
        wg.valid(wg.WgmmaConfig(w, b, s, 2, dtype), p)[0] for w in wg.WGS for b in wg.BNS)}
    assert {c.g for c in cfgs} == {g for g in wg.GSPLITS if any(
        wg.valid(wg.WgmmaConfig(w, b, 1, 2, dtype, g), p)[0] for w in wg.WGS for b in wg.BNS)}
    # no ring deeper than the K tiles a CTA gets, unless the floor of 2 stages
    assert all(c.stages <= max(2, -(-wg.ktiles(p) // (c.split * c.g))) or c.stages == 3 for c in cfgs)


def test_screen_configs_empty_for_odd_k():
    assert wg.screen_configs(GemmProblem(33, 65, 129)) == []


def test_selection_round_trip(tmp_path):
    from gemmrl.results import ResultsWriter
    from gemmrl.search.selection import load_selection, selected_candidates

    rows = [{"mnk": "64_64_1024", "protocol": p, "candidate": f"wgmma:{c}", "algo": str(c), "time_ms": t,
             "verified": True, "floor_ok": True, "layout": "tn", "dtype": "fp16", "acc": "fp32"}
            for p, c, t in (("graph", wg.WgmmaConfig(1, 64, 8, 2), 0.003), ("graph", wg.WgmmaConfig(1, 64, 4, 4), 0.004),
                            ("cold", wg.WgmmaConfig(1, 64, 8, 2), 0.006))]
    path = tmp_path / "sel.csv"
    ResultsWriter(path).write_batch(rows)
    sel = load_selection([path], "wgmma")
    assert sel == {"64_64_1024": {"graph": ("64x64_s8_st2_fp16", "tn"), "cold": ("64x64_s8_st2_fp16", "tn")}}
    cands = selected_candidates(GemmProblem(64, 64, 1024), sel, "wgmma")
    assert [c.name for c in cands] == ["wgmma-sel:cold+graph"] and cands[0].cfg == wg.WgmmaConfig(1, 64, 8, 2)
    assert selected_candidates(GemmProblem(64, 64, 1024, dtype="bf16"), sel, "wgmma") == []


@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_builds_without_spills_and_sizes_agree(dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path / "cache"))
    wg._BUILT.clear()
    b = wg.build_dtype(dtype, "90a")
    assert b.ptxas.kernels == len(wg.WGS) * len(wg.BNS) * len(wg.SPLITS)
    assert b.ptxas.spill_store_bytes == 0 and b.ptxas.max_registers <= 255
    assert not any("C7510" in w or "wgmma" in w for w in b.ptxas.perf_warnings)  # wgmma not serialized
    lib = wg.typed(cs.load_library(b.so))  # host code only below: no GPU needed
    for c in wg.all_configs([dtype]):
        assert lib.gemmrl_wgmma_smem_bytes(c.wg, c.bn, c.split, c.stages) == c.smem_bytes, str(c)
        for M, N in ((1, 8), (129, 641), (4096, 128256)):
            assert lib.gemmrl_wgmma_workspace_bytes(c.wg, c.bn, c.g, M, N) == c.workspace_bytes(M, N), (str(c), M, N)
    assert lib.gemmrl_wgmma_smem_bytes(1, 96, 1, 4) == -1
    wg._BUILT.clear()


# -- GPU ------------------------------------------------------------------------------------------------------
GPU_CASES = [
    ((1, 8, 8), wg.WgmmaConfig(1, 64, 1, 2)), ((33, 65, 136), wg.WgmmaConfig(1, 64, 2, 2)),
    ((33, 65, 136), wg.WgmmaConfig(2, 128, 1, 4)), ((129, 257, 4104), wg.WgmmaConfig(2, 128, 4, 4)),
    ((129, 257, 4104), wg.WgmmaConfig(1, 256, 8, 3)), ((300, 1000, 64), wg.WgmmaConfig(2, 256, 1, 2)),
    ((512, 256, 2048), wg.WgmmaConfig(2, 128, 8, 4)), ((128, 136, 8192), wg.WgmmaConfig(1, 64, 16, 2)),
    ((64, 64, 16384), wg.WgmmaConfig(1, 64, 16, 8)), ((1024, 256, 4096), wg.WgmmaConfig(2, 256, 2, 4)),
    ((3, 4096, 40), wg.WgmmaConfig(1, 128, 1, 2)), ((256, 4096, 4096), wg.WgmmaConfig(2, 256, 1, 4)),
    ((16, 4096, 4096), wg.WgmmaConfig(1, 128, 4, 4)), ((32, 1000, 512), wg.WgmmaConfig(2, 64, 2, 3)),  # A box < BM
    # global splits: one K tile each, uneven K ranges, tails in M, N and K, two CTAs per SM (3 stages), decode
    ((33, 65, 136), wg.WgmmaConfig(1, 64, 1, 2, g=2)), ((64, 64, 16384), wg.WgmmaConfig(1, 64, 1, 2, g=128)),
    ((129, 257, 4104), wg.WgmmaConfig(2, 128, 1, 4, g=8)), ((512, 256, 2048), wg.WgmmaConfig(1, 128, 1, 3, g=8)),
    ((33, 65, 8200), wg.WgmmaConfig(1, 64, 1, 3, g=32)), ((3, 4096, 4104), wg.WgmmaConfig(1, 64, 1, 4, g=2)),
    ((200, 72, 1000), wg.WgmmaConfig(2, 256, 1, 2, g=16)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("shape,cfg", GPU_CASES, ids=lambda x: str(x) if isinstance(x, wg.WgmmaConfig) else
                         "_".join(map(str, x)))
def test_configs_pass_battery(shape, cfg, dtype):
    import dataclasses

    from gemmrl.candidate import make_buffers
    from gemmrl.verify import verify

    p = GemmProblem(*shape, layout="tn", dtype=dtype)
    cfg = dataclasses.replace(cfg, dtype=dtype)
    cand = wg.WgmmaCandidate(cfg)
    bufs = make_buffers(p, "cuda")
    cand.prepare(p, bufs, "graph", None)
    v = verify(cand, p, "cuda")
    assert v.passed, (str(cfg), v.reason)
    ok, why = cs.graph_safety(cand, bufs)
    assert ok, why


@pytest.mark.gpu
@pytest.mark.parametrize("shape,cfg", [((64, 64, 16384), wg.WgmmaConfig(1, 64, 1, 2, g=128)),
                                       ((200, 72, 1000), wg.WgmmaConfig(2, 256, 1, 2, g=16))], ids=str)
def test_global_split_is_deterministic(shape, cfg):
    """Repeated calls and graph replays give the same bits (the barrier resets itself and the sum order is fixed),
    and match a float64 product within the battery's kind of bound."""
    import torch

    from gemmrl.candidate import make_buffers

    p = GemmProblem(*shape, layout="tn")
    cand = wg.WgmmaCandidate(cfg)
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

    for shape in ((1, 8, 8), (512, 256, 2048), (64, 64, 16384), (2048, 2048, 1024)):
        assert_serves(wg.source("fp16"), GemmProblem(*shape))


@pytest.mark.gpu
def test_sixteen_cta_clusters_fit():
    import torch

    torch.cuda.init()
    assert wg.max_active_clusters(wg.WgmmaConfig(1, 64, 16, 2)) >= 1
    assert wg.max_active_clusters(wg.WgmmaConfig(1, 64, 1, 2)) >= torch.cuda.get_device_properties(0).multi_processor_count
