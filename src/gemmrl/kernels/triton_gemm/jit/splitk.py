"""Split-K GEMM (variants ``splitk`` and ``smallm``) and its reduction kernel.

Grid (tiles, SPLIT): program (t, s) computes tile t over K steps [s*KS, (s+1)*KS) (KS whole BK steps, the
last slice clipped at K), in fp32 (or fp16 with ACC_FP16; partials are then summed in fp32).
SWAP_AB (smallm): the accumulator is C^T's tile, acc[BN, BM] = B^T[BN, BK] @ A^T[BK, BM], so the MMA's M
dimension is N (wide) and its N dimension the padded small M. TMA: A and B tiles through device-side
descriptors (zero fill past the edges; K, and N for ``nn``, multiples of 8), else masked pointer loads.

MODE (what a program does with its partial):
  0  SPLIT == 1: cast and store C.
  1  two_pass: store the fp32 partial in ws[s] ([SPLIT, M, N]); ``reduce_kernel`` sums them in order.
  2  fused: store the partial in ws[s]; a barrier, then one atomic increment of the tile's counter (acq_rel,
     GPU scope: the partial is visible before the count); the program that sees SPLIT-1 is the last, sums
     ws[0..SPLIT-1] in that fixed order (bitwise deterministic whoever arrives last), stores C and resets the
     counter to 0 for the next launch. Counters start at 0 (the launcher zero-fills them once).
  The sums of modes 1 and 2 are unrolled RED_GROUP partials at a time (``tl.static_range`` inside a loop over
  the groups): with a plain ``range`` the compiled code kept a loop whose every trip waited for its own loads,
  SPLIT - 1 dependent L2 round trips on the summing program's path (sm_90 PTX, 64_64_16384: the fused epilogue a
  loop at split 8 and 16; the two-pass kernel unrolled by LLVM at split 8, a loop at 16); unrolled whole, the
  loads of every partial were hoisted together and big tiles at split 24-32 spilled (255 registers, up to 276
  bytes). ``plans.red_group`` sizes a group to ~96 registers of loads a thread. The order of the sum is
  unchanged (s = 0, 1, ..., SPLIT - 1), so the result is bitwise the same; only the loads may start early.
  Measured on the H100 (the completed measure pass, benchmarks/acceptance/splitk_anatomy.py): the unroll moved a call by 0-0.4 us; the cost of
  a split is the chain through global memory (partials out, counter, read back), not the sum's loads.
  3  atomic: fp32 atomic adds into ws [M, N] (arrival order: nondeterministic); the last program casts the
     sum to C and zeroes its ws tile and counter for the next launch.
"""

import triton
import triton.language as tl

from .common import mma, pdl_enter, tile_mn, to_out, zero_acc


@triton.jit
def sum_partials(ws_ptr, stride, offs, mask, SPLIT: tl.constexpr, RED_GROUP: tl.constexpr, CACHE: tl.constexpr):
    """ws[0] + ws[1] + ... + ws[SPLIT-1] at ``offs`` (partial s at ws_ptr + s * stride), in that order, RED_GROUP
    partials unrolled at a time (see the module's docstring)."""
    total = tl.load(ws_ptr + offs, mask=mask, other=0.0, cache_modifier=CACHE)
    for g in range((SPLIT - 1) // RED_GROUP):
        for j in tl.static_range(RED_GROUP):
            total += tl.load(ws_ptr + (1 + g * RED_GROUP + j) * stride + offs, mask=mask, other=0.0,
                             cache_modifier=CACHE)
    for j in tl.static_range((SPLIT - 1) % RED_GROUP):
        total += tl.load(ws_ptr + (SPLIT - (SPLIT - 1) % RED_GROUP + j) * stride + offs, mask=mask, other=0.0,
                         cache_modifier=CACHE)
    return total


@triton.jit
def splitk_kernel(a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn, k_per_split,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                  SPLIT: tl.constexpr, MODE: tl.constexpr, SWAP_AB: tl.constexpr, TMA: tl.constexpr,
                  B_NN: tl.constexpr, EVEN_K: tl.constexpr, ACC_FP16: tl.constexpr, UPCAST: tl.constexpr,
                  PDL: tl.constexpr, RED_GROUP: tl.constexpr):
    pdl_enter(PDL)
    tile = tl.program_id(0)
    sid = tl.program_id(1)
    num_m = (M + BM - 1) // BM
    num_n = (N + BN - 1) // BN
    pid_m, pid_n = tile_mn(tile, num_m, num_n, GROUP_M, False)
    k_lo = sid * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if SWAP_AB:
        acc = zero_acc(BN, BM, ACC_FP16)
    else:
        acc = zero_acc(BM, BN, ACC_FP16)
    if TMA:
        a_d = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        if B_NN:
            b_d = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        else:
            b_d = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        for k in range(k_lo, k_hi, BK):
            a = a_d.load([pid_m * BM, k])
            if B_NN:
                bt = b_d.load([k, pid_n * BN]).T
            else:
                bt = b_d.load([pid_n * BN, k])
            if SWAP_AB:
                acc = mma(bt, a.T, acc, UPCAST, ACC_FP16)
            else:
                acc = mma(a, bt.T, acc, UPCAST, ACC_FP16)
    else:
        ram = rm % M
        rbn = rn % N
        a_ptrs = a_ptr + ram[:, None] * s_am + (k_lo + rk)[None, :] * s_ak
        if SWAP_AB:
            b_ptrs = b_ptr + rbn[:, None] * s_bn + (k_lo + rk)[None, :] * s_bk
        else:
            b_ptrs = b_ptr + (k_lo + rk)[:, None] * s_bk + rbn[None, :] * s_bn
        for k in range(k_lo, k_hi, BK):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                k_left = K - k
                a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
                if SWAP_AB:
                    b = tl.load(b_ptrs, mask=rk[None, :] < k_left, other=0.0)
                else:
                    b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
            if SWAP_AB:
                acc = mma(b, a.T, acc, UPCAST, ACC_FP16)
            else:
                acc = mma(a, b, acc, UPCAST, ACC_FP16)
            a_ptrs += BK * s_ak
            b_ptrs += BK * s_bk
    # Output coordinates in the accumulator's own shape ([BN, BM] when swapped).
    if SWAP_AB:
        om = rm[None, :]
        on = rn[:, None]
    else:
        om = rm[:, None]
        on = rn[None, :]
    mask = (om < M) & (on < N)
    c_ptrs = c_ptr + om * s_cm + on * s_cn
    if MODE == 0:
        tl.store(c_ptrs, to_out(acc, c_ptr, UPCAST), mask=mask)
    elif MODE == 1:
        tl.store(ws_ptr + sid * M * N + om * N + on, acc.to(tl.float32), mask=mask)
    elif MODE == 2:
        w_off = om * N + on
        tl.store(ws_ptr + sid * M * N + w_off, acc.to(tl.float32), mask=mask)
        tl.debug_barrier()
        count = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if count == SPLIT - 1:
            total = sum_partials(ws_ptr, M * N, w_off, mask, SPLIT, RED_GROUP, ".cg")
            tl.store(c_ptrs, to_out(total, c_ptr, UPCAST), mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        w_ptrs = ws_ptr + om * N + on
        tl.atomic_add(w_ptrs, acc.to(tl.float32), mask=mask, sem="relaxed", scope="gpu")
        tl.debug_barrier()
        count = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if count == SPLIT - 1:
            total = tl.load(w_ptrs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(c_ptrs, to_out(total, c_ptr, UPCAST), mask=mask)
            tl.store(w_ptrs, tl.where(mask, 0.0, 0.0), mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def reduce_kernel(ws_ptr, c_ptr, M, N, s_cm, s_cn, SPLIT: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr,
                  PDL: tl.constexpr, RED_GROUP: tl.constexpr):
    """C = sum over s = 0..SPLIT-1 (in this order) of ws[s], cast to C's dtype."""
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mn = M * N
    mask = offs < mn
    total = sum_partials(ws_ptr, mn, offs, mask, SPLIT, RED_GROUP, "")
    c_ptrs = c_ptr + (offs // N) * s_cm + (offs % N) * s_cn
    tl.store(c_ptrs, to_out(total, c_ptr, UPCAST), mask=mask)
