"""Generated contenders for decode shapes: Triton GEMV configs the fallback race times beside the vendor plans where
the library has measured nothing at M <= 8.

At M = 1..8 (a decode step's batch) a GEMM streams its weight once; the Triton family's GEMV form (``smallm`` with
``mma=False``: B's tiles straight into registers, the products on the CUDA cores in fp32, no padding of M to the
tensor cores' 16 rows) ran ahead of the vendor's plans on an H200 where the H100's library proposed it: 1.25-1.38x
in graph at 1_4096_4096 (bf16), 1_3584_3584 and 1_4608_3584, and it served Llama-3-8B's down_proj at M = 1 in a
compiled generate. A user without a library at these shapes (a new GPU, a new model) had no such contender: only
the library's entries and their neighbours race.

The rows are ``smallm(mma=False)`` configs (BM the next power of two >= M, BN 16-64, BK 256-1024, 2-8 warps), ranked by
the cost model's estimate (a few microseconds each), the ``COUNT`` best of distinct (BN, BK), each valid under the
Triton family's predicate. They enter the race as library entries measured nowhere (``launch_bound.entry_for``), so
a winner serves only after the full correctness battery at the shape, and the choice cache's key names them. A
machine's first sight of such a shape pays Triton's compile of each row it has not built before (kept in Triton's
disk cache after). ``GEMMRL_GEMV_ROWS=0`` leaves them out.
"""

from __future__ import annotations

import functools

from ..kernels.triton_gemm.configs import GEMV_MAX_M, Arch, SmallMConfig, next_pow2
from ..library import Entry
from ..problem import GemmProblem
from .launch_bound import best_distinct, entry_for, on_this_gpu, ranked, switch

ENV = "GEMMRL_GEMV_ROWS"
COUNT = 3              # contenders a decode shape races
BNS = (16, 32, 64)
BKS = (256, 512, 1024)
WARPS = (2, 4, 8)
SOURCE = "GEMV rows table"  # an entry's source: what put it in the race


class GemvRowsError(ValueError):
    pass


def enabled() -> bool:
    """Whether decode shapes race the table's GEMV configs (GEMMRL_GEMV_ROWS: 1, the default, or 0)."""
    return switch(ENV, f"race Triton GEMV configs at M <= {GEMV_MAX_M}", GemvRowsError)


def table(problem: GemmProblem, arch: Arch) -> list[SmallMConfig]:
    """The table's configs valid for ``problem`` on ``arch``, fastest first by the cost model (none past M = 8)."""
    if not 1 <= problem.M <= GEMV_MAX_M:
        return []
    return ranked((SmallMConfig(BM=next_pow2(problem.M), BN=bn, BK=bk, warps=warps, stages=1, split=1,
                                reduction="none", tma=False, mma=False)
                   for bn in BNS for bk in BKS for warps in WARPS), problem, arch)


def configs(problem: GemmProblem, arch: Arch, count: int = COUNT) -> list[SmallMConfig]:
    """The ``count`` best configs of distinct (BN, BK) for ``problem`` (none past M = 8)."""
    return best_distinct(table(problem, arch), lambda c: (c.BN, c.BK), count)


@functools.lru_cache(maxsize=4096)
def contenders(problem: GemmProblem, gpu: str, arch: Arch) -> tuple[Entry, ...]:
    """The race's GEMV contenders for ``problem`` on the GPU ``gpu`` (library entries measured nowhere)."""
    return tuple(entry_for(cfg, problem, gpu, arch, SOURCE) for cfg in configs(problem, arch))


def here(problem: GemmProblem, gpu: str) -> tuple[Entry, ...]:
    """The GEMV contenders for ``problem`` on the current CUDA device (none when off or without one)."""
    return on_this_gpu(contenders, problem, gpu, enabled)
