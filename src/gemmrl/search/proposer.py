"""What every proposer (the RL policy, the LLM, random search, the cost model) gives the tuning loop and gets back.

The loop asks a proposer for ``k`` proposals for one problem, given a :class:`Context` (the problem, the GPU, this
shape's earlier outcomes and the nearest shapes' outcomes from the trials store); it evaluates them (build, verify,
time beside the vendor paths in a sandboxed worker) and hands every :class:`Outcome` back through ``update``, where
a learning proposer takes its policy-gradient step. Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

from ..measure.evaluate import CandidateSpec
from ..problem import GemmProblem


@dataclass(frozen=True)
class Hardware:
    """What a proposer may condition on: the GPU's name, SM count, shared memory per block, L2, clocks, HBM."""

    name: str = "NVIDIA H100 80GB HBM3"
    sms: int = 132
    smem_per_block_kib: int = 227
    l2_mib: int = 50
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    hbm_gbs: float = 3350.0
    cc: str = "9.0"

    @staticmethod
    def from_device(device: int = 0) -> "Hardware":
        import torch  # start-up cost: torch loads on first use, not on import

        p = torch.cuda.get_device_properties(device)
        clock = getattr(p, "clock_rate", 0) // 1000 or Hardware.sm_clock_mhz
        mem = getattr(p, "memory_clock_rate", 0) // 1000 or Hardware.mem_clock_mhz
        return Hardware(p.name, p.multi_processor_count,
                        getattr(p, "shared_memory_per_block_optin", 232448) // 1024,
                        getattr(p, "L2_cache_size", 50 << 20) >> 20, clock, mem, Hardware.hbm_gbs,
                        f"{p.major}.{p.minor}")


def spec_key(spec: CandidateSpec) -> str:
    """A candidate's identity for deduplication and resume: family, layout and payload (for a source candidate,
    the hash of its code, and of its nvcc flags where it has any: one code built with different ``-D`` flags is
    a different kernel, e.g. the planted CUDA faults)."""
    p = spec.payload
    flags = getattr(p, "flags", ())
    tail = f"|{hashlib.sha256(' '.join(flags).encode()).hexdigest()[:8]}" if flags else ""
    return f"{spec.family}|{spec.layout}|{getattr(p, 'source_hash', p)}{tail}"


@dataclass(frozen=True)
class Proposal:
    """One candidate to evaluate, who proposed it (``source``) and anything the proposer wants back with its
    outcome (``info``: e.g. the policy's arm key, the LLM's prompt id)."""

    spec: CandidateSpec
    source: str
    info: str = ""

    @property
    def key(self) -> str:
        return spec_key(self.spec)


@dataclass(frozen=True)
class Outcome:
    """What the loop measured for one proposal. ``verdict`` is ``ok`` or a failure class (build, shape, rejected,
    oom, error, crash, timeout, cuda_fault, extract); ``reward`` = mean over protocols of log(t_vendor_best /
    t_candidate), NaN when it earned none; ``speedup`` per protocol; ``build`` the compile record (ptxas report
    or structured error); ``profile`` profiler metrics where any were taken."""

    problem: GemmProblem
    proposal: Proposal
    verdict: str
    reward: float = math.nan
    reason: str = ""
    speedup: dict = field(default_factory=dict)
    build: dict = field(default_factory=dict)
    profile: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.verdict == "ok" and math.isfinite(self.reward)


@dataclass(frozen=True)
class Context:
    """Everything a proposer sees for one problem: this shape's earlier outcomes (``own``, oldest first) and the
    outcomes of the nearest shapes already tuned (``neighbours``, nearest first)."""

    problem: GemmProblem
    hardware: Hardware = Hardware()
    own: tuple[Outcome, ...] = ()
    neighbours: tuple[Outcome, ...] = ()

    def tried(self) -> set[str]:
        return {o.proposal.key for o in self.own}


@runtime_checkable
class Proposer(Protocol):
    name: str

    def propose(self, ctx: Context, k: int, rng: Any) -> list[Proposal]:
        """Up to ``k`` proposals for ``ctx.problem`` (fewer, or none, when it has nothing new)."""
        ...

    def update(self, ctx: Context, outcomes: Sequence[Outcome]) -> None:
        """Learn from the outcomes of the proposals it made for ``ctx.problem`` (one group)."""
        ...
