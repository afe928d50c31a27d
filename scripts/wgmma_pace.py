"""Per-K-step pace of the wgmma family (kernels/csrc/wgmma_splitk.cu) under build variants: mbarrier waits by
try_wait (base) or a test_wait spin, and the TMA maps' L2 promotion (256, none, 128 bytes). Mostly one CTA
streaming a long K (64_64_16384, no split), where the time per 64-deep K step shows the main loop's pace.

    PYTHONPATH=src python3 scripts/wgmma_pace.py     # on the GPU machine; prints one line per (variant, case)

Session 13's run: benchmarks/results/h100_wgmma-pace-variants_back-to-back-events_5f752d6_2026-11-25.csv."""
import ctypes, sys, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "src"))
from pathlib import Path
from gemmrl.kernels import cuda_source as cs
SRC = (Path(__file__).resolve().parents[1] / "src/gemmrl/kernels/csrc/wgmma_splitk.cu").read_text()
VARIANTS = {"base": (), "test_wait": ("-DGEMMRL_TEST_WAIT=1",), "l2promo_none": ("-DGEMMRL_L2_PROMOTION=0",),
            "l2promo_128": ("-DGEMMRL_L2_PROMOTION=2",)}
CASES = [("64_64_16384", (1, 64, 1, 8)), ("64_64_16384", (1, 64, 1, 3)), ("64_64_16384", (1, 256, 1, 5)),
         ("64_64_16384", (2, 128, 1, 6)), ("64_64_16384", (1, 64, 16, 8)), ("1_4096_4096", (1, 64, 1, 8)),
         ("4096_4096_4096", (2, 256, 1, 4))]
torch.cuda.init()
for vname, flags in VARIANTS.items():
    b = cs.build(cs.CudaSource(SRC, entry="gemmrl_gemm", shapes=cs.ShapeRange(k_mult=8), flags=flags))
    assert b.ok, b.error
    lib = ctypes.CDLL(b.so)
    fn = lib.gemmrl_wgmma_gemm
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 6 + [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p] + [ctypes.c_int] * 4
    for mnk, cfg in CASES:
        M, N, K = map(int, mnk.split("_"))
        a = torch.randn(M, K, device="cuda", dtype=torch.float16); bt = torch.randn(N, K, device="cuda", dtype=torch.float16)
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        st = torch.cuda.current_stream().cuda_stream
        call = lambda: fn(a.data_ptr(), bt.data_ptr(), c.data_ptr(), M, N, K, K, K, N, None, 0, st, *cfg)
        assert call() == 0
        torch.cuda.synchronize()
        err = float((c.float() - a.float() @ bt.float().t()).norm() / (a.float() @ bt.float().t()).norm())
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3): call()
        e0.record()
        for _ in range(20): call()
        e1.record(); torch.cuda.synchronize()
        us = e0.elapsed_time(e1) / 20 * 1e3
        kt = -(-K // 64) // cfg[2]
        print(f"{vname:13} {mnk:15} {cfg} {us:8.2f} us/call  {us / kt:6.3f} us/K-step  rel_err {err:.2g}", flush=True)
