"""The speed-of-light probe (``gemmrl.kernels.touch``): one launch that reads every 16-bit word of A and B once
and writes zeros into every element of C. Any GEMM must do at least that much memory traffic in at least one
launch, so its time under a protocol bounds what a GEMM kernel can reach there.

Operands come as int16 views (fp16 and bf16 alike: the bytes are what count, and the interpreter has no bf16);
zero bits are 0.0 in both. Programs [0, P_A) read A, [P_A, P_A + P_B) read B, the rest write C, BLOCK words each.
Each reading program sums its words (int32: at most 2**16 * 2**15 in magnitude) and stores the sum only if it
equals 2**31 - 1, which it cannot: the loads are kept and nothing else is written. STORE_ALL stores every sum
(tests check that the sums add up to the operands' sums: each word read exactly once).
"""

import triton
import triton.language as tl


@triton.jit
def touch_kernel(a_ptr, b_ptr, c_ptr, sink_ptr, n_a, n_b, n_c, P_A, P_B,
                 BLOCK: tl.constexpr, STORE_ALL: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    if pid < P_A + P_B:
        if pid < P_A:
            idx = pid * BLOCK + offs
            x = tl.load(a_ptr + idx, mask=idx < n_a, other=0)
        else:
            idx = (pid - P_A) * BLOCK + offs
            x = tl.load(b_ptr + idx, mask=idx < n_b, other=0)
        s = tl.sum(x.to(tl.int32), axis=0)
        if STORE_ALL:
            tl.store(sink_ptr + pid, s)
        else:
            tl.store(sink_ptr + pid, s, mask=s == 2147483647)
    else:
        idx = (pid - P_A - P_B) * BLOCK + offs
        tl.store(c_ptr + idx, tl.full((BLOCK,), 0, tl.int16), mask=idx < n_c)
