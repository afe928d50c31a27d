"""The timing protocols' device-side refill of the inputs: A and B rewritten by one memory-bound Triton kernel per
operand, new numbers on every call, graph-capturable.

Why not ``Tensor.normal_`` or ``tl.randn``: both are bound by their arithmetic, not their writes. On an H200 the
refill before each captured call took ~44 us with ``normal_`` and ~87 us with ``tl.randn`` (Philox and Box-Muller per
element: 0.4 TB/s) at 1_4096_4096, where the GEMM it preceded took 10 us, and the low-power time changed the clock the
GEMMs ran at (``h200_fresh-inputs-cost_*`` in benchmarks/results, docs/findings.md). This kernel spends a few integer
operations per element: a multiply-xorshift hash of (element, key) whose two 16-bit halves summed give a triangular
distribution (mean 0, standard deviation 1, bounded at +-2.45: a normal's shape to the eye, every mantissa bit
random), scaled to the standard deviation the protocols use (K**-0.25, as ``candidate.make_buffers``). The key comes
from a counter on the device that ``bump`` advances before each call: captured in a CUDA graph, every replay and every
captured call reads a counter value no other call read, so no two timed calls see the same inputs, and the host takes
no part.
"""

from __future__ import annotations

from typing import Any

BLOCK = 2048
TRI_NORM = 1.0 / 26754.5  # 1 / the standard deviation of the sum of two uniform 16-bit integers, sqrt(2 (2^32-1) / 12)
CHUNK = 1 << 30   # elements per launch: Philox offsets are 32-bit; each chunk gets its own stream
_KERNEL: list = []


def _kernel():
    """The Triton kernel, defined on first use (importing Triton costs seconds; CPU-only paths never need it)."""
    if not _KERNEL:
        import triton  # start-up cost: Triton loads on first use, not on import
        import triton.language as tl  # start-up cost: as above

        @triton.jit
        def normal_fill(out_ptr, n, counter_ptr, stream, scale, BLOCK: tl.constexpr, TRI_NORM: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            key = (tl.load(counter_ptr) * 65536 + stream).to(tl.uint32)
            key = (key ^ (key >> 16)) * 0x7FEB352D
            key = (key ^ (key >> 15)) * 0x846CA68B
            h = (offs.to(tl.uint32) ^ key) * 0x9E3779B1
            h = (h ^ (h >> 15)) * 0x85EBCA6B
            h = h ^ (h >> 13)
            tri = (h & 0xFFFF).to(tl.float32) + (h >> 16).to(tl.float32) - 65535.0
            tl.store(out_ptr + offs, (tri * (scale * TRI_NORM)).to(out_ptr.dtype.element_ty), mask=offs < n)

        _KERNEL.append((normal_fill, triton.cdiv))
    return _KERNEL[0]


class Refill:
    """Refills operands of one device in place from a counter kept on that device (``seed`` starts it)."""

    def __init__(self, device: Any, seed: int):
        import torch  # start-up cost: torch loads on first use, not on import

        self.counter = torch.tensor([seed & 0x7FFFFFFF], dtype=torch.int64, device=device)

    def bump(self) -> None:
        """Advance the counter (a device-side add: captured, each replay advances it again)."""
        self.counter.add_(1)

    def normal(self, t: Any, operand: int, scale: float) -> None:
        """Write numbers of mean 0 and standard deviation ``scale`` (see the module) into the contiguous tensor ``t``; ``operand`` (0..63) keeps the operands of one call
        on different streams."""
        fill, cdiv = _kernel()
        flat = t.view(-1)
        for j, start in enumerate(range(0, flat.numel(), CHUNK)):
            part = flat[start:start + CHUNK]
            stream = operand * 1024 + j
            fill[(cdiv(part.numel(), BLOCK),)](part, part.numel(), self.counter, stream, scale, BLOCK=BLOCK,
                                               TRI_NORM=TRI_NORM)


__all__ = ["Refill"]
