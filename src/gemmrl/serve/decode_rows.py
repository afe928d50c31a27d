"""Generated contenders for decode shapes: the decode family's own configs, raced beside the vendor plans where the
library has measured nothing at M <= 32.

At a decode step's batch (M tokens against an nn.Linear weight) the GEMM is the time the weight takes to stream from
HBM; the decode family (``kernels/decode_gemm.py``: swap-AB mma.sync, a warp-private cp.async ring, its split
reduced in the same launch) is built for that stream, and its ``screen_configs`` pick the rings and split for a
shape. A user without a library entry at such a shape (a new GPU, a new model) races the ``COUNT`` configs it picks
first (the deepest rings that fit), in layout tn (the weight as nn.Linear holds it), where nvcc is found. They enter
the race as library entries measured nowhere, so a winner serves only after the full correctness battery at the
shape, and the choice cache's key names them. The family builds with nvcc, once a dtype and machine (~25 s): a
call's first sight races them only if that build is cached already (the race's build budget defers them
otherwise), and ``gemmrl.warmup`` builds and races them. ``GEMMRL_DECODE_ROWS=0`` leaves them out.
"""

from __future__ import annotations

import functools
import os

from ..kernels import decode_gemm
from ..kernels.toolchain import find_nvcc
from ..kernels.triton_gemm.configs import Arch
from ..library import Entry
from ..problem import GemmProblem
from ..search.costmodel import floor_seconds
from .launch_bound import on_this_gpu, unmeasured

ENV = "GEMMRL_DECODE_ROWS"
MAX_M = 32             # past it the family's eight n8 token tiles lose to the general kernels
COUNT = 2              # contenders a decode shape races
SOURCE = "decode rows"  # an entry's source: what put it in the race


class DecodeRowsError(ValueError):
    pass


def enabled() -> bool:
    """Whether decode shapes race the decode family's configs (GEMMRL_DECODE_ROWS: 1, the default, or 0); on only
    where nvcc is found (the family builds with it)."""
    v = os.environ.get(ENV, "1").strip()
    if v not in ("0", "1"):
        raise DecodeRowsError(f"{ENV}={v!r}: use 1 (race the decode family's configs at M <= {MAX_M}) or 0 (off)")
    return v == "1" and find_nvcc() is not None


def configs(problem: GemmProblem, arch: Arch, count: int = COUNT) -> list[decode_gemm.DecodeConfig]:
    """The ``count`` configs the family picks first for ``problem`` on ``arch`` (none past M = 32, in layout nn, or
    where its predicate refuses the shape: K % 8, fp32 accumulation, another architecture than sm_90)."""
    if not 1 <= problem.M <= MAX_M or problem.layout != "tn":
        return []
    sms = arch.num_sms
    return [c for c in decode_gemm.screen_configs(problem, sms)
            if decode_gemm.valid(c, problem, sms, arch.cc)[0]][:count]


def entry_for(cfg: decode_gemm.DecodeConfig, problem: GemmProblem, gpu: str, arch: Arch) -> Entry:
    """A decode config as an entry measured nowhere, timed by the roofline floor (at decode sizes the weight's
    stream at the GPU's HBM rate)."""
    return unmeasured("decode", cfg, problem, gpu, arch, floor_seconds(problem, arch) * 1e3, SOURCE)


@functools.lru_cache(maxsize=4096)
def contenders(problem: GemmProblem, gpu: str, arch: Arch) -> tuple[Entry, ...]:
    """The race's decode contenders for ``problem`` on the GPU ``gpu`` (library entries measured nowhere)."""
    return tuple(entry_for(c, problem, gpu, arch) for c in configs(problem, arch))


def here(problem: GemmProblem, gpu: str) -> tuple[Entry, ...]:
    """The decode contenders for ``problem`` on the current CUDA device (none when off or without one)."""
    return on_this_gpu(contenders, problem, gpu, enabled)
