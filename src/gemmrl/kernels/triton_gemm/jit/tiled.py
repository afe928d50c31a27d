"""Classic tiled GEMM: one BM x BN output tile per program, GROUP_M swizzle, pointer loads.

B is read through its strides (s_bk, s_bn), so one kernel serves ``nn`` (b [K,N]: s_bk=N, s_bn=1) and ``tn``
(bt [N,K]: s_bk=1, s_bn=K); Triton specializes unit strides, so the contiguous dimension is known at compile
time. A and B rows/columns past M/N are wrapped (``% M``) instead of masked, so loads stay unmasked in M and N;
K is masked only when K % BK != 0 (EVEN_K). The store is masked.
"""

import triton
import triton.language as tl

from .common import mma, pdl_enter, tile_mn, to_out, zero_acc


@triton.jit
def tiled_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                 EVEN_K: tl.constexpr, ACC_FP16: tl.constexpr, UPCAST: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    num_m = (M + BM - 1) // BM
    num_n = (N + BN - 1) // BN
    pid_m, pid_n = tile_mn(tl.program_id(0), num_m, num_n, GROUP_M, False)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    ram = tl.max_contiguous(tl.multiple_of(rm % M, BM), BM)
    rbn = tl.max_contiguous(tl.multiple_of(rn % N, BN), BN)
    rk = tl.arange(0, BK)
    a_ptrs = a_ptr + ram[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + rbn[None, :] * s_bn
    acc = zero_acc(BM, BN, ACC_FP16)
    for kt in range(0, (K + BK - 1) // BK):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - kt * BK
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = mma(a, b, acc, UPCAST, ACC_FP16)
        a_ptrs += BK * s_ak
        b_ptrs += BK * s_bk
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, to_out(acc, c_ptr, UPCAST), mask=mask)
