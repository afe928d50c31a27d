"""A proposer for tests of the wrappers around one (priors, own-config families): it proposes its specs in order,
none already tried at the shape, and keeps every group of outcomes it is handed."""

from __future__ import annotations

from gemmrl.search.proposer import Proposal


class Inner:
    name = "rl"

    def __init__(self, specs):
        self.specs, self.updates = specs, []

    def propose(self, ctx, k, rng=None):
        return [Proposal(s, "rl") for s in self.specs if s.name not in {o.proposal.spec.name for o in ctx.own}][:k]

    def update(self, ctx, outcomes):
        self.updates.append(list(outcomes))
