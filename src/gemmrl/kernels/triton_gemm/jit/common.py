"""Helpers shared by the kernels: tile order (GROUP swizzle along M or N), the accumulator (its zero and one
multiply-accumulate step, fp32 or the explicit fp16 mode), the output cast, and the programmatic-dependent-launch
entry (``pdl_enter``).

UPCAST is set only under the Triton interpreter with bf16 data: the interpreter cannot multiply bf16 and its
fp32->bf16 cast truncates, so operands are widened (exactly) to fp32 and C, passed as an int16 view, is
rounded to bf16 here (round to nearest even), as planted.py does.
"""

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """With PDL (the launch carries the programmatic-serialization attribute), this grid may start while the one
    before it in the stream still runs: wait here, before any memory access (operands, workspaces, counters and
    the descriptors' global scratch may all be what the previous grid reads or writes), until that grid has
    finished and its writes are visible; then let the next grid launch, so its launch overlaps this one's work.
    Called first in every kernel of the family; a no-op without the attribute."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def tile_mn(tile, num_m, num_n, GROUP: tl.constexpr, N_MAJOR: tl.constexpr):
    """Tile index -> (pid_m, pid_n). N_MAJOR False: groups of GROUP tile rows, walked column by column inside a
    group (the classic swizzle: neighbours share B columns in L2). N_MAJOR True: the same with M and N swapped."""
    if N_MAJOR:
        width = GROUP * num_m
        first = (tile // width) * GROUP
        size = tl.minimum(num_n - first, GROUP)
        pid_n = first + (tile % width) % size
        pid_m = (tile % width) // size
    else:
        width = GROUP * num_n
        first = (tile // width) * GROUP
        size = tl.minimum(num_m - first, GROUP)
        pid_m = first + (tile % width) % size
        pid_n = (tile % width) // size
    return pid_m, pid_n


@triton.jit
def to_out(acc, c_ptr, UPCAST: tl.constexpr):
    """``acc`` cast to the element type of ``c_ptr`` (C's dtype)."""
    if UPCAST:  # C is an int16 view of bf16: round to nearest even by hand
        bits = acc.to(tl.float32).to(tl.int32, bitcast=True)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.int16)
    else:
        return acc.to(c_ptr.dtype.element_ty)



@triton.jit
def zero_acc(R: tl.constexpr, C: tl.constexpr, ACC_FP16: tl.constexpr):
    """An R x C accumulator of zeros: fp16 in the explicit fp16-accumulation mode, else fp32."""
    if ACC_FP16:
        return tl.full((R, C), 0.0, tl.float16)
    else:
        return tl.full((R, C), 0.0, tl.float32)


@triton.jit
def mma(x, y, acc, UPCAST: tl.constexpr, ACC_FP16: tl.constexpr):
    """acc + x @ y, accumulated as ``zero_acc`` made it; UPCAST widens the operands to fp32 first (interpreter)."""
    if UPCAST:
        x = x.to(tl.float32)
        y = y.to(tl.float32)
    if ACC_FP16:
        return tl.dot(x, y, acc, out_dtype=tl.float16)
    else:
        return tl.dot(x, y, acc)
