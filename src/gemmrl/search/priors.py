"""Tuning a new GPU from another GPU's picks: the kernels a library measured best on one GPU model, proposed first on
another (``gemmrl tune --priors LIBRARY``).

A GPU of the same architecture (an H200 after an H100: same sm_90 chip, more bandwidth) tends to rank kernels alike,
so the configs that won there are the first worth timing here; the policy then searches around them. Per shape the
priors are the generated kernels (not the vendor entries: the fallback race measures those here anyway) that the
library holds for the prior GPU at the shape's N, K, dtype and accumulator, in either layout, nearest M first (an
exact entry or a bucket member before the others), one per (family, kernel, layout). ``Primed`` puts up to
``most`` untried priors at the head of each group and fills the rest from its inner proposer, which learns from every
outcome its action set holds (the priors included: a prior the RL policy also offers is a sample of its own arms).
"""

from __future__ import annotations

import math
from typing import Any, Collection, Sequence

from ..kernels.registry import family
from ..library import Entry, Library
from ..measure.evaluate import CandidateSpec
from ..problem import GemmProblem
from .proposer import Context, Outcome, Proposal, Proposer, spec_key

SOURCE = "prior"


class PriorsError(ValueError):
    """A priors library that cannot serve as priors; the message says what to pass instead."""


def prior_gpu(lib: Library, gpu: str | None) -> str:
    """The GPU model whose entries are the priors: ``gpu``, else the library's only one (PriorsError naming those
    it holds where ``gpu`` is not among them or there are several)."""
    held = sorted({e.gpu for e in lib.entries if e.family != "vendor"})
    if not held:
        raise PriorsError("the priors library holds no generated kernel (only vendor entries, or none): pass a "
                          "library tuned on another GPU, e.g. src/gemmrl/libraries/h100.json")
    if gpu is None:
        if len(held) > 1:
            raise PriorsError(f"the priors library holds kernels of several GPUs ({', '.join(held)}): name one with "
                              "--priors-gpu")
        return held[0]
    if gpu not in held:
        raise PriorsError(f"--priors-gpu {gpu!r} has no generated kernel in the priors library; it holds "
                          f"{', '.join(held)}")
    return gpu


def _distance(e: Entry, problem: GemmProblem) -> tuple[float, int]:
    """Nearest first: a measured member of the shape's M before the rest, then |log M - log M_entry|."""
    member = problem.mnk in e.members or e.M == problem.M
    return (0.0 if member else 1.0) + abs(math.log(problem.M) - math.log(e.M)), e.M


def prior_specs(lib: Library, gpu: str, problem: GemmProblem) -> list[CandidateSpec]:
    """The priors at ``problem`` (see the module), nearest M first."""
    near = sorted((e for e in lib.entries if e.gpu == gpu and e.family != "vendor" and e.N == problem.N
                   and e.K == problem.K and e.dtype == problem.dtype and e.acc == problem.acc),
                  key=lambda e: (_distance(e, problem), e.family, e.impl, e.layout))
    out, seen = [], set()
    for e in near:
        spec = CandidateSpec(e.family, e.impl, name=f"{e.family}:{e.impl}:{e.layout}", layout=e.layout)
        if spec_key(spec) in seen or not _valid(spec, problem):
            continue
        seen.add(spec_key(spec))
        out.append(spec)
    return out


def _valid(spec: CandidateSpec, problem: GemmProblem) -> bool:
    """The family's validity predicate at this shape (an M = 1 GEMV config does not run at M = 16)."""
    fam = family(spec.family)
    try:
        return fam.valid(fam.config(spec.payload), problem.with_(layout=spec.layout))[0]
    except ValueError:  # a config this version of the family no longer parses
        return False


class Primed:
    """``inner`` with the priors of each shape proposed first (at most ``most`` a group, untried ones); with
    ``families``, only priors of those families (the ones this machine can build)."""

    def __init__(self, inner: Proposer, lib: Library, gpu: str, most: int = 2,
                 families: Collection[str] | None = None):
        if most < 1:
            raise PriorsError(f"priors per group must be >= 1, got {most}")
        self.inner, self.lib, self.gpu, self.most = inner, lib, gpu, most
        self.families = None if families is None else frozenset(families)  # None: every family; else those built here
        self.name = inner.name
        self._specs: dict[tuple, list[CandidateSpec]] = {}

    def priors(self, problem: GemmProblem) -> list[CandidateSpec]:
        key = (problem.M, problem.N, problem.K, problem.dtype, problem.acc)
        if key not in self._specs:
            self._specs[key] = [s for s in prior_specs(self.lib, self.gpu, problem)
                                if self.families is None or s.family in self.families]
        return self._specs[key]

    def propose(self, ctx: Context, k: int, rng: Any = None) -> list[Proposal]:
        tried = ctx.tried()
        head = [Proposal(s, SOURCE, f"{self.gpu} pick") for s in self.priors(ctx.problem)
                if spec_key(s) not in tried][:min(self.most, k)]
        if len(head) >= k:
            return head
        taken = {p.key for p in head}
        rest = [p for p in self.inner.propose(ctx, k, rng) if p.key not in taken]  # asked for k: some may repeat
        return head + rest[:k - len(head)]

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        self.inner.update(ctx, outcomes)
