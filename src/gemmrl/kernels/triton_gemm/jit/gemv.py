"""GEMV on the CUDA cores: the ``smallm`` variant with ``mma=False`` (M in 1..8, configs.GEMV_MAX_M).

Grid (N tiles, SPLIT): program (t, s) computes C[0:M, t*BN:(t+1)*BN] over K steps [s*KS, (s+1)*KS) (KS whole BK
steps, the last slice clipped at K). Each K step loads B's [BN, BK] tile (``tn``: rows of B^T, contiguous along K;
``nn``: [BK, BN], contiguous along N) and A's [BM, BK] rows straight into registers, widens both to fp32 and adds
their products into an fp32 accumulator of the step's shape; the sum along K happens once, after the loop. No
tensor cores: at M = 1 the MMA's 16-row minimum wastes 15 of 16 rows, and a decode GEMM is bound by streaming B,
which plain wide loads do with no shared-memory ring (measured on an H100 at 1_4096_4096 in the graph protocol:
7.0 us against vendor_best's 8.7 and 15.2 for the swap-AB MMA kernel picked before;
docs/measurements.md, Triton family: the GEMV run).

BM == 1 keeps the accumulator 2-D ([BN, BK] or [BK, BN]); BM > 1 adds A's rows as a leading dimension. Rows of
the BM tile past M, and columns of the last tile past N, wrap around (``% M``, ``% N``) and are masked at the store.

MODE as in jit/splitk.py: 0 store C; 1 two_pass (fp32 partials ws[s], then ``splitk.reduce_kernel``); 2 fused (the
last of a tile's programs, found with an atomic counter, sums ws[0..SPLIT-1] in that fixed order).
"""

import triton
import triton.language as tl

from .common import pdl_enter, to_out
from .splitk import sum_partials


@triton.jit
def gemv_kernel(a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, k_per_split,
                BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, MODE: tl.constexpr,
                B_NN: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr,
                RED_GROUP: tl.constexpr):
    pdl_enter(PDL)
    tile = tl.program_id(0)
    sid = tl.program_id(1)
    k_lo = sid * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    rm = tl.arange(0, BM)
    rn = tile * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rbn = rn % N
    if BM == 1:
        a_ptrs = a_ptr + (k_lo + rk) * s_ak
    else:
        a_ptrs = a_ptr + (rm % M)[:, None] * s_am + (k_lo + rk)[None, :] * s_ak
    if B_NN:
        b_ptrs = b_ptr + (k_lo + rk)[:, None] * s_bk + rbn[None, :] * s_bn
    else:
        b_ptrs = b_ptr + rbn[:, None] * s_bn + (k_lo + rk)[None, :] * s_bk
    if BM == 1:
        if B_NN:
            acc = tl.zeros([BK, BN], dtype=tl.float32)
        else:
            acc = tl.zeros([BN, BK], dtype=tl.float32)
    else:
        if B_NN:
            acc = tl.zeros([BM, BK, BN], dtype=tl.float32)
        else:
            acc = tl.zeros([BM, BN, BK], dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        if EVEN_K:
            b = tl.load(b_ptrs)
            a = tl.load(a_ptrs)
        else:
            k_left = K - k
            if B_NN:
                b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
            else:
                b = tl.load(b_ptrs, mask=rk[None, :] < k_left, other=0.0)
            if BM == 1:
                a = tl.load(a_ptrs, mask=rk < k_left, other=0.0)
            else:
                a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        if BM == 1:
            if B_NN:
                acc += b * a[:, None]
            else:
                acc += b * a[None, :]
        else:
            if B_NN:
                acc += a[:, :, None] * b[None, :, :]
            else:
                acc += a[:, None, :] * b[None, :, :]
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    # the sum along K: out [BM, BN] (BM == 1: [1, BN])
    if BM == 1:
        if B_NN:
            out = tl.sum(acc, axis=0)[None, :]
        else:
            out = tl.sum(acc, axis=1)[None, :]
    else:
        if B_NN:
            out = tl.sum(acc, axis=1)
        else:
            out = tl.sum(acc, axis=2)
    om = rm[:, None]
    on = rn[None, :]
    mask = (om < M) & (on < N)
    c_ptrs = c_ptr + om * s_cm + on * s_cn
    if MODE == 0:
        tl.store(c_ptrs, to_out(out, c_ptr, UPCAST), mask=mask)
    elif MODE == 1:
        tl.store(ws_ptr + sid * M * N + om * N + on, out, mask=mask)
    else:
        w_off = om * N + on
        tl.store(ws_ptr + sid * M * N + w_off, out, mask=mask)
        tl.debug_barrier()
        count = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if count == SPLIT - 1:
            total = sum_partials(ws_ptr, M * N, w_off, mask, SPLIT, RED_GROUP, ".cg")
            tl.store(c_ptrs, to_out(total, c_ptr, UPCAST), mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
