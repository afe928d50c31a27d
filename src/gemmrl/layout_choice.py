"""Which layout to keep a weight in for ``gemmrl.mm``, measured on this GPU.

``mm(a, b)`` serves ``b`` row-major [K, N] (layout ``nn``) or the transpose of a row-major [N, K] tensor (``tn``,
what ``nn.Linear`` holds). Whoever lays a weight out once (a serving stack, the bench's ``gemmrl`` candidate) can
ask which of the two is faster here. The library says which was faster on the machine that measured it; between
two H100s the order of near-equal layouts flips (16_4096_4096 ran one cuBLASLt kernel 4.5% faster in tn than in nn
on one machine and the other way round on another). So where the library has an entry for both layouts, both are
timed here through ``gemmrl.mm`` itself, in the protocol asked for, and the faster wins unless the two are within
``TIE`` (then the library's order stands: a tie is not worth a flip). Where only one layout has an entry, the
library decides: the other would be torch.matmul, which its measurements did not find faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .library import PROTOCOL_ORDER
from .problem import GemmProblem

LAYOUTS = ("tn", "nn")
TIE = 0.005  # relative difference under which the library's order stands
MIN_CALLS = 50
# Host-timed protocols: one discarded round first (the first calls after a graph-protocol run or a build are slow),
# then HOST_CALLS calls each. With 50 calls and no warm-up, an H100 picked tn where nn was 6% faster in the run
# that followed (100_28672_4096, h100_serve60_gemmrl-mm-layout-choice-partial_2567be1_2026-11-24.csv).
HOST_PROTOCOLS = ("offline", "server")
HOST_CALLS = 300


@dataclass(frozen=True)
class LayoutChoice:
    mnk: str
    protocol: str  # the timing protocol the choice was made in (graph, cold, offline, server)
    layout: str
    by: str  # "measured" (both layouts timed here) or "library" (its entries' times)
    times_ms: tuple[tuple[str, float], ...] = ()  # (layout, median ms per call) measured here


def library_order(problem: GemmProblem, protocol: str, device) -> list[tuple[float, str]]:
    """(entry time_ms, layout) of each layout with a library entry for this GPU, fastest first."""
    from . import dispatch

    gpu, _ = dispatch._identity(device)
    order = PROTOCOL_ORDER["graph" if protocol == "graph" else "eager"]
    lib = dispatch.library()
    found = [(e.time_ms, lay) for lay in LAYOUTS
             if (e := lib.lookup_any(gpu, problem.dtype, problem.acc, lay, order, problem.M, problem.N, problem.K))]
    return sorted(found)


def choose(problem: GemmProblem, protocol: str, bufs, timer: Callable[..., Mapping[str, float]] | None,
           min_calls: int = MIN_CALLS) -> LayoutChoice:
    """The layout for ``problem`` in ``protocol`` on ``bufs`` (a, b [K, N], bt [N, K], c), timing with ``timer``
    (a ``make_timer`` of that protocol) when the library has entries for both layouts."""
    from . import dispatch

    lib = library_order(problem, protocol, bufs.a.device)
    if len(lib) < 2 or timer is None:
        return LayoutChoice(problem.mnk, protocol, lib[0][1] if lib else "tn", "library")
    a, b, bt, c = bufs.args()
    ops = {"nn": b, "tn": bt.t()}
    for lay in LAYOUTS:
        dispatch.served_by(a, ops[lay])  # built now: nothing builds while timed or captured
    mm = dispatch.mm
    fns = {lay: (lambda w=ops[lay]: mm(a, w, c)) for lay in LAYOUTS}
    if protocol in HOST_PROTOCOLS:
        timer(fns, min_calls)  # warm-up, discarded
        min_calls = max(min_calls, HOST_CALLS)
    times = dict(timer(fns, min_calls))
    first = lib[0][1]
    other = next(lay for lay in LAYOUTS if lay != first)
    t_first, t_other = times.get(first, float("inf")), times.get(other, float("inf"))
    layout = other if t_other < t_first * (1 - TIE) else first
    return LayoutChoice(problem.mnk, protocol, layout, "measured",
                        tuple((lay, float(times.get(lay, float("inf")))) for lay in LAYOUTS))


def pick_layout(shape: Any, dtype=None, protocol: str = "graph", device=None, min_calls: int = MIN_CALLS) -> LayoutChoice:
    """Which layout ``gemmrl.mm`` serves ``shape`` ('M_N_K', (M, N, K) or GemmProblem) faster on this GPU, in
    ``protocol`` ('graph' for CUDA-graph replay, 'offline' for eager calls; also 'cold', 'server'). Builds what
    serves both layouts first (as ``warmup`` does). Lay the weight out as the answer says: ``nn`` keeps w [K, N]
    row-major, ``tn`` keeps it [N, K] and passes ``w.t()``."""
    import torch

    from .candidate import make_buffers
    from .timing import PROTOCOLS, make_timer

    if protocol not in PROTOCOLS:
        raise ValueError(f"pick_layout: protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")
    from . import dispatch

    dtype = torch.float16 if dtype is None else dtype
    if dtype not in dispatch._DTYPES:
        raise dispatch.DispatchError(f"pick_layout: dtype {dtype} is not served; use torch.float16 or torch.bfloat16")
    M, N, K = dispatch._parse_shape(shape)
    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    problem = GemmProblem(M, N, K, dtype=dispatch._DTYPES[dtype], acc="fp32")
    bufs = make_buffers(problem, device, seed=4321)
    timer = make_timer(bufs, protocol) if device.type == "cuda" or protocol in ("offline", "server") else None
    return choose(problem, protocol, bufs, timer, min_calls)
