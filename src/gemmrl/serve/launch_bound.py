"""Generated contenders for launch-bound shapes: small Triton tiles the fallback race times beside the vendor plans
where the library has measured nothing.

A shape is launch-bound when its roofline floor (``costmodel.floor_seconds`` on this GPU: the larger of its FLOPs at
the tensor-core peak and its bytes at the HBM rate) is under ``FLOOR_S``: a few microseconds of launch, code fetch
and one trip to memory decide its time, not its arithmetic. There the vendor's kernels are general ones
(cuBLAS's 32x32 CUTLASS tiles, nvjet tiles sized for large problems) and a small masked tile can be shorter: on an
H200, the cost model's Triton configs ran 1.07-1.19x of vendor_best in ``cold`` and 1.13-1.36x in ``graph`` on
several shapes of the random any-shape set (``benchmarks/results/h200/h200_tiny-probe_*``), and lost on others
(cuBLAS's GEMV kernels at M = 1), so they race rather than serve.

The contenders are ``tiled`` configs (one masked tile per program: any M, N, K and alignment) from a small table of
tiles (BM 16-128 x BN 16-256, BK 16-64), ranked by the cost model's estimate (``costmodel.estimate``, a few
microseconds each: this runs on a shape's first sight), the ``COUNT`` best of distinct tiles, each valid under
the Triton family's predicate. They enter the race as library entries measured nowhere (no ``members``), so a
winner serves only after the full correctness battery at the shape (dispatch.py), and the choice cache's key
names them (another table races again). A machine's first sight of a launch-bound shape also pays Triton's compile of
each tile it has not built before (kept in Triton's disk cache after). ``GEMMRL_LAUNCH_BOUND=0`` leaves them out.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Callable, Iterable

from ..kernels.triton_gemm.configs import Arch, TiledConfig, valid
from ..library import Entry
from ..problem import GemmProblem
from ..search.costmodel import estimate, floor_seconds

ENV = "GEMMRL_LAUNCH_BOUND"
FLOOR_S = 1.5e-6   # roofline floor under which a shape counts as launch-bound
COUNT = 3          # contenders a launch-bound shape races
TILES = tuple((bm, bn) for bm in (16, 32, 64, 128) for bn in (16, 32, 64, 128, 256))
BKS = (16, 32, 64)
SOURCE = "launch-bound table"  # an entry's source: what put it in the race


class LaunchBoundError(ValueError):
    pass


def switch(env: str, what: str, error: type[Exception]) -> bool:
    """A table's switch: ``env`` 1 (the default) or 0; on only where Triton is installed. A bad value raises
    ``error`` saying what 1 does (``what``)."""
    v = os.environ.get(env, "1").strip()
    if v not in ("0", "1"):
        raise error(f"{env}={v!r}: use 1 ({what}) or 0 (off)")
    return v == "1" and importlib.util.find_spec("triton") is not None


def enabled() -> bool:
    """Whether launch-bound shapes race the table's Triton tiles (GEMMRL_LAUNCH_BOUND: 1, the default, or 0)."""
    return switch(ENV, "race small Triton tiles at launch-bound shapes", LaunchBoundError)


def launch_bound(problem: GemmProblem, arch: Arch) -> bool:
    return floor_seconds(problem, arch) < FLOOR_S


def ranked(cfgs: Iterable, problem: GemmProblem, arch: Arch) -> list:
    """A table's ``cfgs`` that ``problem`` may launch on ``arch`` (the family's predicate), fastest first by the cost
    model's estimate (ties by name)."""
    out = [(estimate(c, problem, arch).seconds, str(c), c) for c in cfgs if valid(c, problem, arch)[0]]
    return [c for _, _, c in sorted(out, key=lambda t: t[:2])]


def best_distinct(cfgs: Iterable, kind: Callable, count: int) -> list:
    """The first ``count`` of ``cfgs`` (fastest first) whose ``kind(cfg)`` differ: kernels of different shape, not
    tuning twins of one."""
    picked: list = []
    for cfg in cfgs:
        if all(kind(cfg) != kind(p) for p in picked):
            picked.append(cfg)
        if len(picked) == count:
            break
    return picked


def table(problem: GemmProblem, arch: Arch) -> list[TiledConfig]:
    """The table's configs valid for ``problem`` on ``arch``, fastest first by the cost model."""
    return ranked((TiledConfig(BM=bm, BN=bn, BK=bk, warps=2 if bm * bn <= 2048 else 4, stages=stages, group_m=1)
                   for bm, bn in TILES for bk in BKS for stages in (2, 3)), problem, arch)


def configs(problem: GemmProblem, arch: Arch, count: int = COUNT) -> list[TiledConfig]:
    """The ``count`` best configs of distinct tiles for a launch-bound ``problem`` (none for any other)."""
    if not launch_bound(problem, arch):
        return []
    return best_distinct(table(problem, arch), lambda c: (c.BM, c.BN), count)


@functools.lru_cache(maxsize=None)
def arch_of(device_index: int) -> Arch:
    """The Triton predicates' view of the CUDA device ``device_index`` (asked once per device)."""
    return Arch.from_device(device_index)


def arch_here() -> Arch | None:
    """The current CUDA device's Arch; None without one (nothing to race on)."""
    import torch  # start-up cost: torch loads on first use, not on import

    return arch_of(torch.cuda.current_device()) if torch.cuda.is_available() else None


def on_this_gpu(table_contenders, problem: GemmProblem, gpu: str, on: Callable[[], bool]) -> tuple[Entry, ...]:
    """``table_contenders(problem, gpu, arch)`` on the current CUDA device; none on the CPU, when the table's switch
    ``on()`` says off, or without a CUDA device."""
    if gpu == "cpu" or not on():
        return ()
    arch = arch_here()
    return () if arch is None else table_contenders(problem, gpu, arch)


def here(problem: GemmProblem, gpu: str) -> tuple[Entry, ...]:
    """The launch-bound contenders for ``problem`` on the current CUDA device (none when off or without one)."""
    return on_this_gpu(contenders, problem, gpu, enabled)


def unmeasured(family: str, cfg, problem: GemmProblem, gpu: str, arch: Arch, time_ms: float, source: str) -> Entry:
    """A generated config as a library entry measured nowhere (no ``members``): the race times it, and a winner
    serves only after the battery at the shape. ``time_ms`` is an estimate (the library's schema asks for one;
    nothing serves by it)."""
    return Entry(gpu=gpu, cc=str(arch.cc), dtype=problem.dtype, acc=problem.acc, layout=problem.layout,
                 protocol="graph", M=problem.M, N=problem.N, K=problem.K, family=family, impl=str(cfg),
                 algo=str(cfg), time_ms=time_ms, vendor_best_ms=time_ms, vendor_best="cublas_tn", m_lo=problem.M,
                 m_hi=problem.M, members=(), verified=False, source=source)


def entry_for(cfg, problem: GemmProblem, gpu: str, arch: Arch, source: str) -> Entry:
    """A table's Triton config as an entry measured nowhere, timed by the cost model's estimate."""
    return unmeasured("triton", cfg, problem, gpu, arch, estimate(cfg, problem, arch).seconds * 1e3, source)


@functools.lru_cache(maxsize=4096)
def contenders(problem: GemmProblem, gpu: str, arch: Arch) -> tuple[Entry, ...]:
    """The race's launch-bound contenders for ``problem`` on the GPU ``gpu`` (library entries measured nowhere)."""
    return tuple(entry_for(cfg, problem, gpu, arch, SOURCE) for cfg in configs(problem, arch))
