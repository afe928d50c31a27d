"""The timing protocols' device-side refill of the inputs: random-normal A and B written by one memory-bound Triton
kernel per operand, new numbers on every call, graph-capturable.

Why not ``Tensor.normal_``: on an H200 the refill it made before each captured call took ~44 us at 1_4096_4096 (A and
a 4096 x 4096 B: 0.7 TB/s), four times the GEMM it preceded, and its low-power time changed the clock the GEMMs ran
at (benchmarks/results/h200_fresh-inputs-cost_f01efeb_2026-11-28.csv, docs/findings.md). This kernel is bound by
its writes alone. It draws
its numbers with Triton's Philox counter generator, keyed by a device-side counter that ``bump`` advances before each
call: captured in a CUDA graph, every replay and every captured call reads a counter value no other call read, so no
two timed calls see the same inputs, and the host takes no part. Values are normal with the standard deviation the
protocols use (K**-0.25), as ``candidate.make_buffers`` draws them.
"""

from __future__ import annotations

from typing import Any

BLOCK = 1024
CHUNK = 1 << 30   # elements per launch: Philox offsets are 32-bit; each chunk gets its own stream
_KERNEL: list = []


def _kernel():
    """The Triton kernel, defined on first use (importing Triton costs seconds; CPU-only paths never need it)."""
    if not _KERNEL:
        import triton  # start-up cost: Triton loads on first use, not on import
        import triton.language as tl  # start-up cost: as above

        @triton.jit
        def normal_fill(out_ptr, n, counter_ptr, stream, scale, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            seed = tl.load(counter_ptr) * 65536 + stream
            x = tl.randn(seed, offs)
            tl.store(out_ptr + offs, (x * scale).to(out_ptr.dtype.element_ty), mask=offs < n)

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
        """Write N(0, scale^2) into the contiguous tensor ``t``; ``operand`` (0..63) keeps the operands of one call
        on different streams."""
        fill, cdiv = _kernel()
        flat = t.view(-1)
        for j, start in enumerate(range(0, flat.numel(), CHUNK)):
            part = flat[start:start + CHUNK]
            stream = operand * 1024 + j
            fill[(cdiv(part.numel(), BLOCK),)](part, part.numel(), self.counter, stream, scale, BLOCK=BLOCK)


__all__ = ["Refill"]
