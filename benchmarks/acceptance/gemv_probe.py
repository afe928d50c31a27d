"""Probe (the GEMV run, before the GEMV joined the family as ``smallm(..., mma=False)``): dot-free GEMV kernels at
M = 1 against torch.matmul, in graph (40 calls back to back in one CUDA graph, median of 15 replays) and cold (one
call after writing 200 MB). Configs are named BN<n>_BK<k>_w<warps>_s<split>_st<num_stages>_r<1: sum along K every
step, 0: once after the loop>; split > 1 adds fp32 atomics into a zeroed buffer and a copy (two more kernels in the
timed call: a probe of the bandwidth, not a candidate). Prints a whitespace table; the H100 run is
benchmarks/results/h100/h100_gemv-probe_m1_graph-cold_2026-11-26.csv.

    python3 benchmarks/acceptance/gemv_probe.py          # on the GPU machine, ~60 s
"""
import itertools, statistics, sys, time
import torch, triton, triton.language as tl

@triton.jit
def gemv_tn(x_ptr, w_ptr, y_ptr, ws_ptr, N, K, k_per_split, BN: tl.constexpr, BK: tl.constexpr,
            SPLIT: tl.constexpr, RED1: tl.constexpr):
    pid_n = tl.program_id(0); sid = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN); rk = tl.arange(0, BK)
    k_lo = sid * k_per_split
    w_ptrs = w_ptr + rn[:, None] * K + (k_lo + rk)[None, :]
    x_ptrs = x_ptr + k_lo + rk
    if RED1:
        acc1 = tl.zeros([BN], dtype=tl.float32)
    else:
        acc = tl.zeros([BN, BK], dtype=tl.float32)
    for k in range(k_lo, k_lo + k_per_split, BK):
        w = tl.load(w_ptrs).to(tl.float32); x = tl.load(x_ptrs).to(tl.float32)
        if RED1:
            acc1 += tl.sum(w * x[None, :], axis=1)
        else:
            acc += w * x[None, :]
        w_ptrs += BK; x_ptrs += BK
    if RED1:
        out = acc1
    else:
        out = tl.sum(acc, axis=1)
    if SPLIT == 1:
        tl.store(y_ptr + rn, out.to(tl.float16))
    else:
        tl.atomic_add(ws_ptr + rn, out, sem="relaxed")

@triton.jit
def gemv_nn(x_ptr, w_ptr, y_ptr, ws_ptr, N, K, k_per_split, BN: tl.constexpr, BK: tl.constexpr,
            SPLIT: tl.constexpr, RED1: tl.constexpr):
    pid_n = tl.program_id(0); sid = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN); rk = tl.arange(0, BK)
    k_lo = sid * k_per_split
    w_ptrs = w_ptr + (k_lo + rk)[:, None] * N + rn[None, :]
    x_ptrs = x_ptr + k_lo + rk
    if RED1:
        acc1 = tl.zeros([BN], dtype=tl.float32)
    else:
        acc = tl.zeros([BK, BN], dtype=tl.float32)
    for k in range(k_lo, k_lo + k_per_split, BK):
        w = tl.load(w_ptrs).to(tl.float32); x = tl.load(x_ptrs).to(tl.float32)
        if RED1:
            acc1 += tl.sum(w * x[:, None], axis=0)
        else:
            acc += w * x[:, None]
        w_ptrs += BK * N; x_ptrs += BK
    if RED1:
        out = acc1
    else:
        out = tl.sum(acc, axis=0)
    if SPLIT == 1:
        tl.store(y_ptr + rn, out.to(tl.float16))
    else:
        tl.atomic_add(ws_ptr + rn, out, sem="relaxed")

def graph_us(fn, calls=40, reps=15):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(calls): fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(ts)

flush = torch.empty(200 << 20, dtype=torch.uint8, device="cuda")
def cold_us(fn, reps=25):
    ts = []
    for _ in range(reps):
        flush.fill_(1)
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)

shapes = [(4096, 4096), (4096, 14336), (14336, 4096)]
cfgs = [(bn, bk, w, sp, st, r1) for bn, bk, w in [(8, 512, 4), (16, 256, 4), (16, 512, 4), (32, 256, 4), (16, 1024, 8), (32, 512, 8), (64, 256, 8), (16, 256, 2), (32, 128, 4)]
        for sp in (1, 2, 4) for st in (1, 3) for r1 in (False, True)]
print("N K layout cfg graph_us cold_us torch_graph torch_cold maxerr", flush=True)
t0 = time.time()
for N, K in shapes:
    x = torch.randn(1, K, device="cuda", dtype=torch.float16)
    wt = torch.randn(N, K, device="cuda", dtype=torch.float16)  # tn: W [N, K]
    wn = wt.t().contiguous()                                      # nn: W [K, N]
    ref = (x.float() @ wt.float().t()).half()
    y = torch.empty(1, N, device="cuda", dtype=torch.float16)
    ws = torch.zeros(N, device="cuda", dtype=torch.float32)
    for layout, w in ((("tn", wt), ("nn", wn)) if (N, K) == (4096, 4096) else (("tn", wt),)):
        tg = graph_us(lambda: torch.matmul(x, w.t() if layout == "tn" else w, out=y))
        tc = cold_us(lambda: torch.matmul(x, w.t() if layout == "tn" else w, out=y))
        print(N, K, layout, "torch", f"{tg:.2f}", f"{tc:.2f}", flush=True)
        best = {}
        for bn, bk, warps, sp, st, r1 in cfgs:
            if K % (bk * sp) or N % bn: continue
            kern = gemv_tn if layout == "tn" else gemv_nn
            kps = K // sp
            def fn():
                if sp > 1: ws.zero_()
                kern[(N // bn, sp)](x, w, y, ws, N, K, kps, BN=bn, BK=bk, SPLIT=sp, RED1=r1, num_warps=warps, num_stages=st)
                if sp > 1: y.copy_(ws)
            try:
                fn(); torch.cuda.synchronize()
                err = (y.float() - ref.float()).abs().max().item()
                g = graph_us(fn); c = cold_us(fn)
            except Exception as e:
                print(N, K, layout, (bn, bk, warps, sp, st, r1), "ERR", str(e)[:100], flush=True); continue
            print(N, K, layout, f"BN{bn}_BK{bk}_w{warps}_s{sp}_st{st}_r{int(r1)}", f"{g:.2f}", f"{c:.2f}", f"{tg:.2f}", f"{tc:.2f}", f"{err:.3g}", flush=True)
        if time.time() - t0 > 400: sys.exit(0)
