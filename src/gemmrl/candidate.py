"""The one calling convention every GEMM candidate (vendor baseline, generated, imported) follows.

A candidate is called as ``cand(a, b, bt, c)`` with, for a problem (M, N, K):
  a  [M,K] row-major, b [K,N] row-major (layout ``nn``), bt [N,K] row-major (= B column-major,
  layout ``tn``), c [M,N] row-major output owned by the harness.
It reads ``b`` or ``bt`` as its ``layout`` declares (both are always supplied and hold the same B,
as in CUDA-L2's harness), writes every element of ``c`` and nothing else, and launches its work on
torch's current CUDA stream. ``prepare`` runs once per (problem, protocol) before any check or
timing (handle creation, algorithm selection); ``timer`` lets it time alternatives in the protocol
it will be measured in (cuBLASLt autotuning does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

from .problem import GemmProblem

# timer(callables: {name: zero-arg callable}, min_calls) -> {name: time_ms}
Timer = Callable[[Mapping[str, Callable[[], None]], int], Mapping[str, float]]


@runtime_checkable
class Candidate(Protocol):
    name: str
    layout: str
    acc: str

    def prepare(self, problem: GemmProblem, bufs: "Buffers", protocol: str, timer: Timer | None) -> None: ...

    def __call__(self, a: Any, b: Any, bt: Any, c: Any) -> None: ...

    def info(self) -> dict[str, Any]: ...


@dataclass
class FnCandidate:
    """A candidate made from a plain function ``fn(a, b, bt, c)``."""

    name: str
    layout: str
    fn: Callable[[Any, Any, Any, Any], None]
    acc: str = "fp32"
    extra: dict[str, Any] = field(default_factory=dict)

    def prepare(self, problem: GemmProblem, bufs: "Buffers", protocol: str, timer: Timer | None) -> None:
        return None

    def __call__(self, a, b, bt, c) -> None:
        self.fn(a, b, bt, c)

    def info(self) -> dict[str, Any]:
        return dict(self.extra)


@dataclass(frozen=True)
class Buffers:
    """Harness-owned operands for one problem: both forms of B are filled from the same values."""

    problem: GemmProblem
    a: Any
    b: Any
    bt: Any
    c: Any

    def args(self) -> tuple[Any, Any, Any, Any]:
        return self.a, self.b, self.bt, self.c


def torch_dtype(name: str):
    import torch  # start-up cost: torch loads on first use, not on import

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]


def make_buffers(problem: GemmProblem, device: Any = "cuda", seed: int = 0, scale: float | None = None,
                 on_device: bool = False) -> Buffers:
    """Random-normal A and B (scaled by K**-0.25 each so C has unit scale), C pre-filled with NaN. The values come
    from a CPU generator (the same on every device: the interpreter tier and the GPU see the same operands), or with
    ``on_device`` from ``device``'s own generator, drawn there in the dtype: a 128256 x 4096 operand takes seconds of
    CPU time to draw and cast (12 s on two cores), a few milliseconds on the GPU (the serving race, whose values only
    need to be random)."""
    import torch  # start-up cost: torch loads on first use, not on import

    dt = torch_dtype(problem.dtype)
    s = problem.K ** -0.25 if scale is None else scale
    M, N, K = problem.M, problem.N, problem.K
    if on_device:
        gen = torch.Generator(device=device).manual_seed(seed)
        a = torch.randn(M, K, generator=gen, device=device, dtype=dt).mul_(s)
        b = torch.randn(K, N, generator=gen, device=device, dtype=dt).mul_(s)
    else:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        a = (torch.randn(M, K, generator=gen) * s).to(dt).to(device)
        b = (torch.randn(K, N, generator=gen) * s).to(dt).to(device)
    bt = b.t().contiguous()
    c = torch.full((M, N), float("nan"), dtype=dt, device=device)
    return Buffers(problem, a, b, bt, c)


def refill(bufs: Buffers, gen: Any = None, last: str = "tn") -> None:
    """Write fresh random inputs in place (device RNG) and NaN into C: CUDA-L2's per-iteration refresh,
    without its zero-fill of C (which hides kernels that accumulate into C).

    ``last`` names the form of B written last (``tn``: bt, drawn from b; ``nn``: b, drawn from bt). The form written
    last is left dirty in L2, so a candidate reading it right after the refill can start warm while one reading the
    other form first pays for the write-back: the host-timed loop draws ``last`` at random each iteration so that
    neither layout gets that head start every time."""
    if last not in ("tn", "nn"):
        raise ValueError(f"refill: last={last!r}; use 'tn' or 'nn'")
    s = bufs.problem.K ** -0.25
    bufs.a.normal_(0.0, s, generator=gen)
    first, second = (bufs.b, bufs.bt) if last == "tn" else (bufs.bt, bufs.b)
    first.normal_(0.0, s, generator=gen)
    second.copy_(first.t())
    bufs.c.fill_(float("nan"))
