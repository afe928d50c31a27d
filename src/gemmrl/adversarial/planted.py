"""Planted GEMM candidates: one real Triton kernel (masked pointer loads, any M, N, K) with a defect chosen
by a constexpr MODE, or none. They must be rejected by the verification battery, each by its own check,
and the correct one must pass; they run compiled on CUDA tensors and under the Triton interpreter on CPU
tensors. Tests: tests/test_verify.py (interpreter tier on the CPU, gpu tier on the GPU).

Triton is imported inside ``_planted_kernel``, never at module import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any


def _torch():
    import torch  # start-up cost: torch loads on first use, not on import

    return torch


_MODES = {"correct": 0, "fp16_acc": 1, "round_inputs": 2, "skip_last_k": 3, "partial_write": 4}
_BF16_ACC = 5  # fp16_acc on bf16 data: the accumulator is kept in bf16


@functools.lru_cache(maxsize=None)
def _planted_kernel(interpret: bool):
    """The planted GEMM kernel, compiled (CUDA tensors) or under the Triton interpreter (CPU tensors).
    Triton is imported here, never at module import."""
    global triton, tl
    import triton  # optional dependency (the triton extra), loaded on first use
    import triton.language as tl  # optional dependency (the triton extra), loaded on first use

    with triton.knobs.runtime.scope():
        triton.knobs.runtime.interpret = interpret

        @triton.jit
        def _planted_mm(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MODE: tl.constexpr,
                        UPCAST: tl.constexpr, SHIFT: tl.constexpr):
            rm = tl.program_id(0) * BM + tl.arange(0, BM)
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            if MODE == 1:
                acc = tl.full((BM, BN), 0.0, tl.float16)
            else:
                acc = tl.full((BM, BN), 0.0, tl.float32)
            k_tiles = (K + BK - 1) // BK
            if MODE == 3:
                k_tiles = k_tiles - 1
            for kt in range(0, k_tiles):
                kk = kt * BK + rk
                a = tl.load(a_ptr + rm[:, None] * s_am + kk[None, :] * s_ak,
                            mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
                b = tl.load(b_ptr + kk[:, None] * s_bk + rn[None, :] * s_bn,
                            mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
                if UPCAST:  # the interpreter cannot multiply bf16: widen (exact) and multiply in fp32
                    a = a.to(tl.float32)
                    b = b.to(tl.float32)
                if MODE == 2:  # round the mantissa to 23 - SHIFT bits, half away from zero
                    ab = (a.to(tl.float32).to(tl.int32, bitcast=True) + (1 << (SHIFT - 1))) & (-(1 << SHIFT))
                    bb = (b.to(tl.float32).to(tl.int32, bitcast=True) + (1 << (SHIFT - 1))) & (-(1 << SHIFT))
                    a = ab.to(tl.float32, bitcast=True).to(a.dtype)
                    b = bb.to(tl.float32, bitcast=True).to(b.dtype)
                if MODE == 1:
                    acc = tl.dot(a, b, acc, out_dtype=tl.float16)
                elif MODE == 5:
                    acc = (acc + tl.dot(a, b)).to(tl.bfloat16).to(tl.float32)
                else:
                    acc = tl.dot(a, b, acc)
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            if MODE == 4:
                mask = mask & (rn[None, :] < N - 1)
            if UPCAST:  # c is passed as int16: round to bf16 here (RNE; the interpreter's own cast truncates)
                bits = acc.to(tl.float32).to(tl.int32, bitcast=True)
                out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.int16)
            else:
                out = acc.to(c_ptr.dtype.element_ty)
            tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, out, mask=mask)

    return _planted_mm


@dataclass
class PlantedCandidate:
    """A Triton GEMM (pointer loads with masks, any M, N, K) with one planted defect, or none.

    ``expect`` is the check that must reject it on an acc='fp32' problem ('' for the correct one; on an
    acc='fp16' problem the fp16-accumulating one is legitimate), ``why`` the reason."""

    name: str
    mode: str
    expect: str
    why: str
    layout: str = "nn"
    acc: str = "fp32"
    block: tuple[int, int, int] = (32, 32, 16)
    num_warps: int = 4

    def prepare(self, problem, bufs, protocol, timer) -> None:
        return None

    def info(self) -> dict[str, Any]:
        return {"mode": self.mode, "block": list(self.block), "expect": self.expect}

    def __call__(self, a, b, bt, c) -> None:
        torch = _torch()
        interpret = a.device.type == "cpu"
        kernel = _planted_kernel(interpret)
        M, K = a.shape
        N = c.shape[1]
        bm, s_bk, s_bn = (b, b.stride(0), b.stride(1)) if self.layout == "nn" else (bt, bt.stride(1), bt.stride(0))
        mode = _MODES[self.mode]
        if mode == 1 and a.dtype == torch.bfloat16:
            mode = _BF16_ACC
        BM, BN, BK = self.block
        grid = (-(-M // BM), -(-N // BN))
        upcast = interpret and a.dtype == torch.bfloat16  # the interpreter's bf16 dot and casts are not usable
        kernel[grid](a, bm, c.view(torch.int16) if upcast else c, M, N, K, a.stride(0), a.stride(1), s_bk, s_bn,
                     c.stride(0), c.stride(1), BM=BM, BN=BN, BK=BK, MODE=mode, UPCAST=upcast,
                     SHIFT=16 if a.dtype == torch.float16 else 20, num_warps=self.num_warps)


def planted_candidates(layout: str = "nn", block: tuple[int, int, int] = (32, 32, 16)) -> list[PlantedCandidate]:
    """One correct Triton GEMM (fp32 accumulation, must pass) and four wrong ones, each with its reason."""
    specs = [
        ("correct", "", "fp32 accumulation, masked tails: must pass"),
        ("fp16_acc", "accuracy", "accumulates in fp16 (bf16 for bf16 data): error grows like sqrt(K/32) over the "
                                 "correctly rounded result; CUDA-L2's 0/1 check cannot see it"),
        ("round_inputs", "accuracy", "rounds A and B to bf16 precision (7 mantissa bits; 3 bits, fp8-e4m3-like, "
                                     "for bf16 data) before the dot"),
        ("skip_last_k", "exact_int", "skips its last K tile: products missing from every element"),
        ("partial_write", "nan_fill", "never writes C's last column (store mask off by one)"),
    ]
    return [PlantedCandidate(f"planted_{mode}_{layout}", mode, expect, why, layout=layout, block=block)
            for mode, expect, why in specs]
