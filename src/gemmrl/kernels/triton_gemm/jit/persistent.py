"""Persistent GEMM: ``gridDim.x`` programs loop over the output tiles (tile order N_MAJOR, GROUP swizzle).

TMA=True: device-side tensor descriptors (tl.make_tensor_descriptor; the launcher provides their global
scratch): A [M,K], B as stored (``tn``: bt [N,K], block [BN,BK], used as b.T; ``nn``: b [K,N], block [BK,BN]),
C [M,N]. TMA zero-fills loads past the edges and clips stores, so tails need no masks (but K and N must be
multiples of 8: 16-byte strides). FLATTEN/WS are tl.range's flatten and warp_specialize on the tile loop;
SUBTILE stores the tile as two BM x BN/2 halves. The epilogue recomputes its tile from a second counter
(``tile_c``), as Triton's persistent tutorial does, so a flattened loop can overlap it with the next loads.
TMA=False: the same loop with masked pointer loads and stores, for any shape (the fallback).
"""

import triton
import triton.language as tl

from .common import mma, pdl_enter, tile_mn, to_out, zero_acc


@triton.jit
def persistent_kernel(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
                      N_MAJOR: tl.constexpr, TMA: tl.constexpr, B_NN: tl.constexpr, FLATTEN: tl.constexpr,
                      WS: tl.constexpr, SUBTILE: tl.constexpr, EVEN_K: tl.constexpr, ACC_FP16: tl.constexpr,
                      UPCAST: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    start = tl.program_id(0)
    step = tl.num_programs(0)
    num_m = (M + BM - 1) // BM
    num_n = (N + BN - 1) // BN
    k_tiles = (K + BK - 1) // BK
    num_tiles = num_m * num_n
    if TMA:
        a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        if B_NN:
            b_d = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        else:
            b_d = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        if SUBTILE:
            c_d = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN // 2])
        else:
            c_d = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    rk = tl.arange(0, BK)
    tile_c = start - step
    for tile in tl.range(start, num_tiles, step, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = tile_mn(tile, num_m, num_n, GROUP, N_MAJOR)
        acc = zero_acc(BM, BN, ACC_FP16)
        if TMA:
            om = pid_m * BM
            on = pid_n * BN
            for kt in range(k_tiles):
                a = a_d.load([om, kt * BK])
                if B_NN:
                    b = b_d.load([kt * BK, on])
                else:
                    b = b_d.load([on, kt * BK]).T
                acc = mma(a, b, acc, UPCAST, ACC_FP16)
        else:
            rm = (pid_m * BM + tl.arange(0, BM)) % M
            rn = (pid_n * BN + tl.arange(0, BN)) % N
            a_ptrs = a_ptr + rm[:, None] * s_am + rk[None, :] * s_ak
            b_ptrs = b_ptr + rk[:, None] * s_bk + rn[None, :] * s_bn
            for kt in range(k_tiles):
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
        tile_c += step
        cm, cn = tile_mn(tile_c, num_m, num_n, GROUP, N_MAJOR)
        if TMA:
            if SUBTILE:
                acc3 = tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1))
                acc0, acc1 = tl.split(acc3)
                c_d.store([cm * BM, cn * BN], to_out(acc0, c_ptr, UPCAST))
                c_d.store([cm * BM, cn * BN + BN // 2], to_out(acc1, c_ptr, UPCAST))
            else:
                c_d.store([cm * BM, cn * BN], to_out(acc, c_ptr, UPCAST))
        else:
            sm = cm * BM + tl.arange(0, BM)
            sn = cn * BN + tl.arange(0, BN)
            mask = (sm[:, None] < M) & (sn[None, :] < N)
            tl.store(c_ptr + sm[:, None] * s_cm + sn[None, :] * s_cn, to_out(acc, c_ptr, UPCAST), mask=mask)
