"""The decode family (kernels/decode_gemm.py, csrc/decode_stream.cu): the weight streamed at the HBM roofline, M <= 64.

CPU tier: names, the validity predicate at tiny, odd and decode shapes, the screened configs, the kernel's data map
(permuted K, swapped A/B fragments of mma m16n8k16, warp-to-row/K assignment, epilogue index math, split reduction)
replayed in numpy against a matmul, the registry's entry, and (where nvcc exists) one build per dtype with no spills
whose shared-memory sizes match the predicate's. GPU tier: configs through the battery, repeated calls bit-for-bit
equal (the split's reduction order) and graph capture with replays."""

import numpy as np
import pytest

from gemmrl.kernels import decode_gemm as dg
from gemmrl.kernels import registry, toolchain
from gemmrl.problem import GemmProblem, read_shapes

needs_nvcc = pytest.mark.skipif(not toolchain.find_nvcc(), reason="needs nvcc (the CUDA toolkit) to compile")
SHAPES_FILE = "benchmarks/shapes/decode_models5_m1-32_weights100mb.txt"


@pytest.mark.parametrize("cfg", [dg.DecodeConfig(), dg.DecodeConfig(4, 2, 2, 4, 3, "bf16", 1),
                                 dg.DecodeConfig(1, 1, 8, 6, 16, u=1), dg.DecodeConfig(2, 2, 4, 4, 2, u=2)],
                         ids=str)
def test_name_round_trip(cfg):
    assert dg.DecodeConfig.parse(str(cfg)) == cfg
    assert registry.family("decode").parse(str(cfg)) == cfg
    assert registry.of_candidate(f"decode:{cfg}").name == "decode"


@pytest.mark.parametrize("text", ["r2_w1x8_st8_fp16", "r2_w1x8_st8_s1_fp32", "", "2_1x8_st8_s1_fp16"])
def test_bad_names_say_what_to_write(text):
    with pytest.raises(dg.DecodeConfigError, match="expected e.g."):
        dg.DecodeConfig.parse(text)


@pytest.mark.parametrize("cfg,why", [(dg.DecodeConfig(3, 1, 8), "instantiated (R, WR, WK)"),
                                     (dg.DecodeConfig(stages=5), "ring depth"), (dg.DecodeConfig(u=3), "u3"), (dg.DecodeConfig(split=0), "split 0"),
                                     (dg.DecodeConfig(split=33), "split 33"), (dg.DecodeConfig(dtype="fp8"), "dtype")])
def test_valid_config_rejects_with_reason(cfg, why):
    ok, msg = dg.valid_config(cfg)
    assert not ok and why in msg


@pytest.mark.parametrize("mnk,cfg,why", [
    ("1_4096_4100", dg.DecodeConfig(), "K % 8"),
    ("65_4096_4096", dg.DecodeConfig(), "M <= 64"),
    ("64_4096_4096", dg.DecodeConfig(2, 1, 8, 8, u=1), "shared memory"),   # 8 warps x 8 deep x 12 vectors x 512 B
    ("1_4096_64", dg.DecodeConfig(split=3, stages=4, u=1), "no work"),     # 2 chunks of 32 cannot split 3 ways
    ("1_4096_256", dg.DecodeConfig(1, 1, 8, 3, 3), "no work"),             # 2 steps of 128
    ("1_14336_4096", dg.DecodeConfig(1, 1, 8, 8, 2, u=1), "split only"),   # 896 row blocks need no split
    ("1_4096_4096", dg.DecodeConfig(dtype="bf16"), "config dtype"),
])
def test_valid_rejects_at_the_problem(mnk, cfg, why):
    M, N, K = map(int, mnk.split("_"))
    ok, msg = dg.valid(cfg, GemmProblem(M, N, K))
    assert not ok and why in msg


def test_valid_rejects_layout_acc_and_arch():
    cfg = dg.DecodeConfig()
    assert "layout tn" in dg.valid(cfg, GemmProblem(1, 64, 64, layout="nn"))[1]
    assert "fp32" in dg.valid(cfg, GemmProblem(1, 64, 64, acc="fp16"))[1]
    assert "sm_80" in dg.valid(cfg, GemmProblem(1, 64, 64), cc=80)[1]


@pytest.mark.parametrize("mnk", ["1_1_8", "1_37_72", "3_130_264", "7_1_8", "8_16_8", "63_257_520", "64_8191_4104"])
def test_tiny_and_odd_shapes_are_served_by_some_config(mnk):
    M, N, K = map(int, mnk.split("_"))
    p = GemmProblem(M, N, K)
    cfgs = dg.screen_configs(p)
    assert cfgs and all(dg.valid(c, p)[0] for c in cfgs)


def test_the_screen_leads_with_a_deep_ring_at_small_m():
    """At M <= 8 the first config screened keeps >= 96 KB of weight in flight an SM (the vendor's decode tiles keep
    ~128 KB; the shallow rings' 32-64 KB streamed at ~3.2 TB/s on an H200), the U = 1 pattern at its deepest too."""
    for p in read_shapes(SHAPES_FILE):
        if p.M > 8:
            continue
        cfgs = dg.screen_configs(p)
        assert dg.weight_in_flight(cfgs[0], p.M) >= 96 * 1024, (p.mnk, str(cfgs[0]))
        assert cfgs[-1].u == 1 and cfgs[-1].stages == 16
    assert dg.weight_in_flight(dg.DecodeConfig(1, 1, 8, 3, 1, u=4), 1) == 64 * 1024


def test_mt_follows_m():
    assert [dg.mt_for(m) for m in (1, 8, 9, 16, 17, 32, 33, 64, 65)] == [1, 1, 2, 2, 4, 4, 8, 8, 0]


def test_screen_of_the_decode_shapes():
    probs = read_shapes(SHAPES_FILE)
    assert len(probs) == 20 and {p.M for p in probs} == {1, 8, 16, 32}
    for p in probs:
        assert p.N * p.K * 2 >= 100e6
        cfgs = dg.screen_configs(p, limit=5)
        assert 3 <= len(cfgs) <= 5
        for c in cfgs:
            assert dg.valid(c, p)[0]
            # a split only where the row blocks alone leave SMs without a CTA, and then at least one CTA an SM
            assert c.split == 1 or dg.row_blocks(c, p) < 132 <= dg.row_blocks(c, p) * c.split \
                or dg.split_for(c, p) == c.split


# ---------------------------------------------------------------------------------------------------------
# the kernel's data map, replayed in numpy (what each lane loads, the mma fragments, the epilogue's index math)
# ---------------------------------------------------------------------------------------------------------
def _mma_frags(w, x, hh):
    """(A 16x16, B 16x8) of one mma of a warp: lane (g, t) gives logical k 2t+e (+8) from physical 4hh + 2kk + e."""
    Af, Bf = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for kk in range(2):
            for e in range(2):
                k = 2 * t + e + 8 * kk
                Af[g, k] = w[0, lane, 4 * hh + 2 * kk + e]
                Af[g + 8, k] = w[1, lane, 4 * hh + 2 * kk + e]
                Bf[k, g] = x[lane, 4 * hh + 2 * kk + e]
    return Af, Bf


def emulate(A, W, cfg: dg.DecodeConfig):
    """C as decode_kernel computes it: warps (wr, wk), lanes' 16-byte chunks, fragments, epilogue, split."""
    R, WR, WK, S, U = cfg.r, cfg.wr, cfg.wk, cfg.split, cfg.u
    M, K = A.shape
    N = W.shape[0]
    MT, RB = dg.mt_for(M), cfg.rows
    nch = -(-K // (32 * U))
    cps = -(-nch // S)
    C = np.full((M, N), np.nan)
    ws = np.zeros((S, M, N))
    for bx in range(-(-N // RB)):
        nb = bx * RB
        for s in range(S):
            red = np.zeros((WR * WK, R, MT, 32, 4))
            for warp in range(WR * WK):
                wr, wk = warp % WR, warp // WR
                n0 = nb + wr * 16 * R
                cb, ce = s * cps + wk, min(nch, s * cps + cps)
                for i, u in [(i, u) for i in range(-(-(ce - cb) // WK) if ce > cb else 0) for u in range(U)]:
                    col = (cb + WK * i) * 32 * U + 32 * u
                    w, x = np.zeros((R, 2, 32, 8)), np.zeros((MT, 32, 8))
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        c0 = col + 8 * t
                        if c0 >= K:
                            continue
                        for r in range(R):
                            for h in range(2):
                                if n0 + r * 16 + g + 8 * h < N:
                                    w[r, h, lane] = W[n0 + r * 16 + g + 8 * h, c0:c0 + 8]
                        for j in range(MT):
                            if g + 8 * j < M:
                                x[j, lane] = A[g + 8 * j, c0:c0 + 8]
                    for r in range(R):
                        for j in range(MT):
                            for hh in range(2):
                                Af, Bf = _mma_frags(w[r], x[j], hh)
                                D = Af @ Bf
                                for lane in range(32):
                                    g, t = lane >> 2, lane & 3
                                    red[warp, r, j, lane] += [D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t],
                                                              D[g + 8, 2 * t + 1]]
            redf = red.reshape(-1)
            for idx in range(M * RB):
                tok, nl = divmod(idx, RB)
                if nb + nl >= N:
                    continue
                wr_, r, rr = nl // (16 * R), (nl // 16) % R, nl % 16
                ln, comp, j = (rr & 7) * 4 + ((tok & 7) >> 1), (rr >> 3) * 2 + (tok & 1), tok >> 3
                v = sum(redf[((((k * WR + wr_) * R + r) * MT + j) * 32 + ln) * 4 + comp] for k in range(WK))
                ws[s, tok, nb + nl] = v
        for tok in range(M):
            for n in range(nb, min(N, nb + RB)):
                C[tok, n] = sum(ws[k, tok, n] for k in range(S))
    return C


@pytest.mark.parametrize("mnk,cfg", [
    ("1_40_96", dg.DecodeConfig(1, 1, 8, 4, 1, u=1)), ("3_37_200", dg.DecodeConfig(2, 1, 8, 4, 1, u=1)),
    ("9_70_136", dg.DecodeConfig(2, 2, 4, 6, 2, u=1)), ("20_130_264", dg.DecodeConfig(2, 4, 2, 4, 3, u=1)),
    ("33_50_72", dg.DecodeConfig(4, 2, 2, 4, 2, u=1)), ("8_16_8", dg.DecodeConfig(2, 4, 1, 8, 1, u=1)),
    ("1_40_392", dg.DecodeConfig(1, 1, 8, 3, 1, u=4)), ("9_70_520", dg.DecodeConfig(2, 2, 4, 3, 2, u=2)),
    ("17_33_1000", dg.DecodeConfig(1, 1, 8, 2, 1, u=4)),
])
def test_data_map_computes_the_product(mnk, cfg):
    M, N, K = map(int, mnk.split("_"))
    assert dg.valid(cfg, GemmProblem(M, N, K))[0]
    rng = np.random.default_rng(M * N + K)
    A = rng.integers(-3, 4, (M, K)).astype(float)
    W = rng.integers(-3, 4, (N, K)).astype(float)
    np.testing.assert_array_equal(emulate(A, W, cfg), A @ W.T)


# ---------------------------------------------------------------------------------------------------------
# compile (CPU tier where nvcc exists)
# ---------------------------------------------------------------------------------------------------------
@needs_nvcc
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_builds_without_spills(dtype, monkeypatch, tmp_path):
    monkeypatch.setenv("GEMMRL_CACHE_DIR", str(tmp_path))
    from gemmrl.kernels import cuda_source as cs

    b = cs.build(dg.source(dtype), "90a")
    assert b.ok, b.error
    n = len(dg.SHAPES) * len(dg.DEPTHS) * len(dg.MTS)
    assert b.ptxas.kernels == n and b.ptxas.spill_store_bytes == 0 and b.ptxas.spill_load_bytes == 0
    assert not b.ptxas.perf_warnings


# ---------------------------------------------------------------------------------------------------------
# GPU tier
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("mnk,text", [("1_37_72", "r1_w1x8_st8_s1"), ("9_70_136", "r2_w2x4_st6_s2"),
                                      ("33_50_72", "r4_w2x2_st4_s2"), ("17_1000_1032", "r2_w2x4_u2_st3_s4"),
                                      ("3_4100_4104", "r1_w1x8_u4_st3_s1"), ("5_300_4104", "r1_w1x8_st16_s1"),
                                      ("8_200_2056", "r1_w1x8_u2_st8_s2"), ("2_129_1032", "r1_w1x8_u4_st4_s2"),
                                      ("12_70_1000", "r1_w1x8_st12_s1")])
def test_battery_repeat_and_graph(dtype, mnk, text):
    import torch

    from gemmrl.candidate import make_buffers
    from gemmrl.verify import verify

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    M, N, K = map(int, mnk.split("_"))
    p = GemmProblem(M, N, K, dtype)
    cand = dg.DecodeCandidate(dg.DecodeConfig.parse(f"{text}_{dtype}"))
    bufs = make_buffers(p, "cuda", seed=3)
    cand.prepare(p, bufs, "graph", None)
    v = verify(cand, p, "cuda")
    assert v.passed, v.reason
    cand(*bufs.args())
    first = bufs.c.clone()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            cand(*bufs.args())
    for _ in range(5):
        bufs.c.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(bufs.c.view(torch.int16), first.view(torch.int16))
