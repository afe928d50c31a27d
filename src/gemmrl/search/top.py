"""``top_candidates(problem, k)``: the cost model's ``k`` best Triton configs for a shape, as bench candidates.

``gemmrl bench --triton-top K`` passes this (through ``BenchSpec.extra``) so that, per shape, the configs the
cost model ranks highest are verified by the battery and timed beside the vendor paths. The configs come from
``search.costmodel.prune`` on the GPU the bench runs on (``Arch.from_device``; an H100 where there is no GPU),
so every one passes that GPU's validity predicate. ``prune`` reserves ``k // 4`` slots (at least one) for the
best of each variant valid for the shape before filling the rest by predicted time, so every live variant is
represented when ``k`` is at least the number of live variants (3 for M >= 64, 4 for decode shapes).
The ranking is the cold-L2 one (``warm_l2=False``): candidates are built once per shape, for every protocol.

Names are ``triton:<config>``, unique per shape; ``info()['algo']`` is the config string, which the results
rows record. Nothing here compiles: a config that fails to compile fails in ``prepare``, which bench records as
that candidate's row and moves on.
"""

from __future__ import annotations

from ..kernels.triton_gemm.candidate import TritonGemm
from ..kernels.triton_gemm.configs import H100, Arch
from ..problem import GemmProblem
from .costmodel import prune
from .space import VARIANTS

_ARCHS: dict[int, Arch] = {}


def current_arch() -> Arch:
    """The GPU torch would launch on now; H100 (the predicates' default) when there is no CUDA device."""
    try:
        import torch  # start-up cost: torch loads on first use, not on import

        if not torch.cuda.is_available():
            return H100
        dev = torch.cuda.current_device()
    except ImportError:
        return H100
    if dev not in _ARCHS:
        _ARCHS[dev] = Arch.from_device(dev)
    return _ARCHS[dev]


def top_configs(problem: GemmProblem, k: int, arch: Arch | None = None) -> list:
    """The ``k`` configs the cost model predicts fastest for ``problem`` on ``arch``, several variants among them."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k == 0:
        return []
    return prune(problem, k, arch or current_arch(), min_per_variant=max(1, k // len(VARIANTS)))


def top_candidates(problem: GemmProblem, k: int, arch: Arch | None = None) -> list[TritonGemm]:
    """``TritonGemm`` candidates named ``triton:<config>`` for the ``k`` best configs (fewer if fewer are valid)."""
    out: list[TritonGemm] = []
    seen: set[str] = set()
    for cfg in top_configs(problem, k, arch):
        name = f"triton:{cfg}"
        if name in seen:
            continue
        seen.add(name)
        out.append(TritonGemm(cfg, layout=problem.layout, acc=problem.acc, name=name))
    return out
