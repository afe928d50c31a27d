"""Families that pick their own configs at a shape, proposed ahead of a proposer's: the decode family at M <= 32.

The RL policy's actions are Triton and CUTLASS configs (its features are theirs). A family whose module picks a
handful of configs per shape itself (``screen_configs``: the decode family's deep and shallow rings, its split for
the shape) is screened whole by the tuning loop instead: its untried configs at the shape take the first places of
a group (at most ``most``), the wrapped proposer fills the rest, and every outcome goes to the trials store, the
rewards and the library as any other does. The wrapped proposer's update sees all outcomes and learns from those it
proposed (the policy's update ignores candidates outside its action set).

    proposer = OwnFirst(policy, layouts=("tn", "nn"), families=("decode",), most=2)
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Sequence

from ..kernels import decode_gemm
from ..kernels.registry import family
from ..measure.evaluate import CandidateSpec
from ..problem import GemmProblem
from .proposer import Context, Outcome, Proposal, Proposer, spec_key

SOURCE = "screened"
# family -> its own pick of configs at a shape (layout tn), given the SM count
OWN: dict[str, Callable[[GemmProblem, int], list]] = {"decode": decode_gemm.screen_configs}
# family -> the shapes it is proposed at: the decode family where the weight is the whole cost (a token tile of
# at most 32; at M = 64 its eight n8 tiles lose to the general kernels)
WHERE: dict[str, Callable[[GemmProblem], bool]] = {"decode": lambda p: p.M <= 32}


class OwnConfigsError(ValueError):
    pass


def own_specs(problem: GemmProblem, layouts: Collection[str], families: Collection[str],
              sms: int = 132) -> list[CandidateSpec]:
    """The configs the ``families`` pick at ``problem`` (layout tn, where ``layouts`` has it), each valid there."""
    if "tn" not in layouts:
        return []
    pt = problem.with_(layout="tn")
    out: list[CandidateSpec] = []
    for name in families:
        fam = family(name)
        if not WHERE[name](pt):
            continue
        for cfg in OWN[name](pt, sms):
            if fam.valid(cfg, pt)[0]:
                out.append(CandidateSpec(name, str(cfg), name=f"{name}:{cfg}:tn", layout="tn"))
    return out


class OwnFirst:
    """``inner`` with the own-config families' untried configs at each shape proposed first (at most ``most`` a
    group)."""

    def __init__(self, inner: Proposer, layouts: Collection[str], families: Collection[str] = ("decode",),
                 most: int = 2):
        unknown = sorted(set(families) - set(OWN))
        if unknown:
            raise OwnConfigsError(f"families {', '.join(unknown)} do not pick their own configs; use some of "
                                  f"{', '.join(OWN)}")
        if most < 1:
            raise OwnConfigsError(f"own-config proposals per group must be >= 1, got {most}")
        self.inner, self.layouts, self.families, self.most = inner, tuple(layouts), tuple(families), most
        self.name = inner.name
        self._specs: dict[tuple, list[CandidateSpec]] = {}

    def specs(self, problem: GemmProblem, sms: int = 132) -> list[CandidateSpec]:
        key = (problem.M, problem.N, problem.K, problem.dtype, problem.acc, sms)
        if key not in self._specs:
            self._specs[key] = own_specs(problem, self.layouts, self.families, sms)
        return self._specs[key]

    def propose(self, ctx: Context, k: int, rng: Any = None) -> list[Proposal]:
        tried = ctx.tried()
        head = [Proposal(s, SOURCE, s.family) for s in self.specs(ctx.problem, ctx.hardware.sms)
                if spec_key(s) not in tried][:min(self.most, k)]
        if len(head) >= k:
            return head
        taken = {p.key for p in head}
        rest = [p for p in self.inner.propose(ctx, k, rng) if p.key not in taken]
        return head + rest[:k - len(head)]

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        self.inner.update(ctx, outcomes)
