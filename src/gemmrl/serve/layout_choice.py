"""Which layout to keep a weight in for ``gemmrl.mm``, measured on this GPU.

``mm(a, b)`` serves ``b`` row-major [K, N] (layout ``nn``) or the transpose of a row-major [N, K] tensor (``tn``,
what ``nn.Linear`` holds). Whoever lays a weight out once (a serving stack, the bench's ``gemmrl`` candidate) can
ask which of the two is faster here. The library says which was faster on the machine that measured it; between
two H100s the order of near-equal layouts flips (16_4096_4096 ran one cuBLASLt kernel 4.5% faster in tn than in nn
on one machine and the other way round on another). So where the library has an entry for both layouts, both are
timed here through ``gemmrl.mm`` itself, in the protocol asked for, and the faster wins unless the two are within
``TIE`` (then the library's order stands: a tie is not worth a flip). Where one layout or neither has an entry and
the fallback race serves the others (a CUDA device, ``GEMMRL_VENDOR_FALLBACK=race``), both are timed too, ``tn``
first where neither has one: each layout is then served by the vendor plan raced best for it, and on an H200 the
``nn`` form ran 2-9% faster in cold at several model shapes and 8% in graph at 165_28672_4096 (cuBLASLt's best kernel
for the other operand order). Otherwise the library decides: the other layout would be torch.matmul, which its
measurements did not find faster.

The layouts are timed in device time. For ``graph`` and ``cold`` that is the protocol itself. For the host-timed
protocols (``offline``, ``server``) it is their inputs timed with the device clock (``timing.time_refilled``: before
each call the host loop's own refill, A and both forms of B written with the form written last drawn at random, no
flush; then the call between CUDA events), with the eager entries served: the layout changes the kernel, not the host
path, and host-clock rounds of one path differ by 5-15% on an H100 (the noise rule's re-measurements in
h100_serve60_gemmrl-mm-layout-choice-partial_2567be1_2026-11-24.csv), against layout differences of 1-7%. Timed
with the host clock, the choice went to ``tn`` on all 8 shapes of that run where it was made, including
100_28672_4096 and 32_14336_4096, where ``nn`` ran the same cuBLASLt algorithm 3-6% faster in the bench's own
offline rows and in graph. Timed in ``cold`` instead (the operands evicted, which a host loop's refill never leaves
them), the choice went to ``tn`` at 182_6144_4096 on an H200 (27.9 against 29.2 us), where every nn plan ran 8-10%
ahead of every tn plan in the bench's ``offline`` rechecks: a refill leaves part of B in L2, and how much depends on
the layout that reads it. Only where there is no device clock (the CPU test tier) do host protocols time with the
host clock. What the device clock leaves out, the host cost of the path each layout's entry serves, decides a host
protocol's choice as it decides the library's eager entries (``library.HOST_ORDER``): the layout served by the
cheaper host path wins when its device time is within ``library.HOST_BAND`` (2%) of the other's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ..candidate import make_buffers
from ..library import HOST_BAND, PROTOCOL_ORDER, Entry, host_rank
from ..problem import GemmProblem
from ..timing import HOST_PROTOCOLS, PROTOCOLS, REFILLED, make_timer
from . import dispatch

LAYOUTS = ("tn", "nn")
TIE = 0.005  # relative difference under which the library's order stands
MIN_CALLS = 50
COLD_CALLS = 100  # calls per layout when the choice is timed call by call (cold, refilled: median)


def timed_in(protocol: str, device_type: str = "cuda") -> str:
    """How both layouts are timed to choose the layout for ``protocol`` (see the module's docstring): the protocol
    itself, or for a host protocol on a CUDA device its inputs with the device clock (``timing.REFILLED``)."""
    return REFILLED if protocol in HOST_PROTOCOLS and device_type == "cuda" else protocol


@dataclass(frozen=True)
class LayoutChoice:
    mnk: str
    protocol: str  # the timing protocol the choice was made in (graph, cold, offline, server)
    layout: str
    by: str  # "measured" (both layouts timed here) or "library" (its entries' times)
    times_ms: tuple[tuple[str, float], ...] = ()  # (layout, median ms per call) measured here


def library_entries(problem: GemmProblem, protocol: str, device) -> dict[str, Entry]:
    """The library entry that serves each layout for this GPU in ``protocol`` (layouts without one left out)."""
    gpu, _ = dispatch._identity(device)
    order = PROTOCOL_ORDER["graph" if protocol == "graph" else "eager"]
    lib = dispatch.library()
    return {lay: e for lay in LAYOUTS
            if (e := lib.lookup_any(gpu, problem.dtype, problem.acc, lay, order, problem.M, problem.N, problem.K))}


def library_order(problem: GemmProblem, protocol: str, device) -> list[tuple[float, str]]:
    """(entry time_ms, layout) of each layout with a library entry for this GPU, fastest first."""
    return sorted((e.time_ms, lay) for lay, e in library_entries(problem, protocol, device).items())


def _host_rank(e: Entry) -> int:
    return host_rank(e.impl if e.family == "vendor" else f"{e.family}:{e.impl}")


def races(device) -> bool:
    """Whether a layout without a library entry is served by the fallback race here (not torch.matmul)."""
    return device.type == "cuda" and dispatch._fallback_settings() == "race"


def choose(problem: GemmProblem, protocol: str, bufs, timer: Callable[..., Mapping[str, float]] | None,
           min_calls: int = MIN_CALLS) -> LayoutChoice:
    """The layout for ``problem`` in ``protocol`` on ``bufs`` (a, b [K, N], bt [N, K], c), timing with ``timer``
    (a ``make_timer`` of ``timed_in(protocol, ...)``) when the library has entries for both layouts."""
    ents = library_entries(problem, protocol, bufs.a.device)
    lib = sorted((e.time_ms, lay) for lay, e in ents.items())
    if timer is None or (len(lib) < 2 and not races(bufs.a.device)):
        return LayoutChoice(problem.mnk, protocol, lib[0][1] if lib else "tn", "library")
    a, b, bt, c = bufs.args()
    ops = {"nn": b, "tn": bt.t()}
    for lay in LAYOUTS:
        dispatch.served_by(a, ops[lay])  # built now: nothing builds while timed or captured
    mm = dispatch.mm
    fns = {lay: (lambda w=ops[lay]: mm(a, w, c)) for lay in LAYOUTS}
    if hasattr(timer, "for_layouts"):  # each layout's samples refill only the form of B it reads, as the bench's
        timer = timer.for_layouts({lay: lay for lay in LAYOUTS})  # paths of one layout (not both, nor the copy)
    if timed_in(protocol, a.device.type) in ("cold", REFILLED):
        min_calls = max(min_calls, COLD_CALLS)
    times = dict(timer(fns, min_calls))
    first = lib[0][1] if lib else "tn"
    other = next(lay for lay in LAYOUTS if lay != first)
    t = {lay: times.get(lay, float("inf")) for lay in LAYOUTS}
    layout = other if t[other] < t[first] * (1 - TIE) else first
    if protocol in HOST_PROTOCOLS and len(ents) == 2:  # a host-timed call also pays its path's host cost (library.HOST_ORDER)
        rank = {lay: _host_rank(e) for lay, e in ents.items()}
        cheap, dear = sorted(LAYOUTS, key=rank.get)
        if rank[cheap] < rank[dear] and t[cheap] <= t[dear] * (1 + HOST_BAND):
            layout = cheap
    return LayoutChoice(problem.mnk, protocol, layout, "measured",
                        tuple((lay, float(t[lay])) for lay in LAYOUTS))


def pick_layout(shape: Any, dtype=None, protocol: str = "graph", device=None, min_calls: int = MIN_CALLS) -> LayoutChoice:
    """Which layout ``gemmrl.mm`` serves ``shape`` ('M_N_K', (M, N, K) or GemmProblem) faster on this GPU, in
    ``protocol`` ('graph' for CUDA-graph replay, 'offline' for eager calls; also 'cold', 'server'). Builds what
    serves both layouts first (as ``warmup`` does). Lay the weight out as the answer says: ``nn`` keeps w [K, N]
    row-major, ``tn`` keeps it [N, K] and passes ``w.t()``."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"pick_layout: protocol {protocol!r}; use one of {', '.join(PROTOCOLS)}")

    dtype = torch.float16 if dtype is None else dtype
    if dtype not in dispatch._DTYPES:
        raise dispatch.DispatchError(f"pick_layout: dtype {dtype} is not served; use torch.float16 or torch.bfloat16")
    M, N, K = dispatch._parse_shape(shape)
    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    problem = GemmProblem(M, N, K, dtype=dispatch._DTYPES[dtype], acc="fp32")
    bufs = make_buffers(problem, device, seed=4321, on_device=True)
    timing = timed_in(protocol, device.type)
    timer = make_timer(bufs, timing) if device.type == "cuda" or timing in HOST_PROTOCOLS else None
    return choose(problem, protocol, bufs, timer, min_calls)
