"""The Triton family's configuration space, as data: per variant, the values each config field may take (a
variant may list several such products, whose union is its space: ``smallm`` on tensor cores and as a GEMV).

``enumerate_space(problem, arch)`` yields every combination that the variant's validity predicate
(``kernels.triton_gemm.configs.valid``) accepts for that problem on that GPU, so anything it yields may be
launched; ``space_size`` counts them per variant. The nondeterministic split-K reduction (fp32 atomics) is
left out unless asked for. Nothing here imports torch or triton.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterable, Iterator, Mapping, Sequence, Union

from ..kernels.triton_gemm.configs import CONFIG_TYPES, H100, Arch, Config, valid
from ..problem import GemmProblem

Axes = Mapping[str, Sequence]
SPACE: Mapping[str, Union[Axes, Sequence[Axes]]] = {
    "tiled": {
        "BM": (16, 32, 64, 128, 256), "BN": (16, 32, 64, 128, 256), "BK": (16, 32, 64, 128),
        "warps": (2, 4, 8), "stages": (2, 3, 4, 5), "group_m": (1, 4, 8, 16),
    },
    "persistent": {
        "BM": (64, 128, 256), "BN": (64, 128, 256), "BK": (32, 64, 128), "warps": (4, 8),
        "stages": (2, 3, 4, 5), "group_m": (1, 8), "order": ("m", "n"), "tma": (True, False),
        "flatten": (False, True), "ws": (False, True), "subtile": (False, True), "ctas_per_sm": (1, 2),
    },
    "splitk": {
        "BM": (16, 32, 64, 128), "BN": (32, 64, 128, 256), "BK": (32, 64, 128, 256), "warps": (4, 8),
        "stages": (2, 3, 4, 5), "group_m": (8,), "split": (2, 3, 4, 6, 8, 12, 16, 24, 32),
        "reduction": ("two_pass", "fused", "atomic"), "tma": (False, True), "nondeterministic": (False, True),
    },
    "smallm": (
        {
            "BM": (16, 32, 64), "BN": (32, 64, 128, 256), "BK": (64, 128, 256), "warps": (1, 2, 4, 8),
            "stages": (2, 3, 4, 5, 6), "split": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
            "reduction": ("none", "two_pass", "fused"), "tma": (False, True),
        },
        {  # mma=False, the GEMV (M in 1..8): registers, not a ring, so one stage and long K steps
            "BM": (1, 2, 4, 8), "BN": (16, 32, 64), "BK": (128, 256, 512, 1024), "warps": (2, 4, 8), "stages": (1,),
            "split": (1, 2, 4, 8), "reduction": ("none", "two_pass", "fused"), "tma": (False,), "mma": (False,),
        },
    ),
}
VARIANTS = tuple(SPACE)


def _parts(variant: str) -> Sequence[Axes]:
    axes = SPACE[variant]
    return (axes,) if isinstance(axes, Mapping) else axes


def raw_size(variant: str) -> int:
    """Combinations before the validity predicate."""
    return sum(math.prod(len(values) for values in axes.values()) for axes in _parts(variant))


def _combos(variant: str) -> Iterator[Config]:
    cls = CONFIG_TYPES[variant]
    for axes in _parts(variant):
        names = list(axes)
        for values in itertools.product(*(axes[n] for n in names)):
            yield cls(**dict(zip(names, values)))


def enumerate_space(problem: GemmProblem, arch: Arch = H100, variants: Iterable[str] | None = None,
                    nondeterministic: bool = False) -> Iterator[Config]:
    """Every valid config for ``problem`` on ``arch`` (variants in SPACE order)."""
    for variant in variants or VARIANTS:
        if variant not in SPACE:
            raise ValueError(f"unknown variant {variant!r}; use {', '.join(VARIANTS)}")
        for cfg in _combos(variant):
            if getattr(cfg, "nondeterministic", False) and not nondeterministic:
                continue
            if valid(cfg, problem, arch)[0]:
                yield cfg


def space_size(problem: GemmProblem, arch: Arch = H100, nondeterministic: bool = False) -> dict[str, int]:
    """Valid configs per variant for ``problem`` on ``arch``, and their ``total``."""
    sizes = {v: 0 for v in VARIANTS}
    for cfg in enumerate_space(problem, arch, nondeterministic=nondeterministic):
        sizes[cfg.variant] += 1
    sizes["total"] = sum(sizes[v] for v in VARIANTS)
    return sizes
