"""``gemmrl`` as a bench candidate: each call is ``gemmrl.mm(a, b, out=c)``, the public entry point a user calls.

``gemmrl bench --library FILE`` (or ``--library default``) adds it beside the vendor paths. Per protocol it keeps
the layout ``layout_choice.choose`` gives: where the library has entries for both layouts, both timed through
``gemmrl.mm`` on the bench's buffers in device time (the protocol measured for graph and cold, cold for the
host-timed ones), else the layout of the library's entry; ``prepare`` builds what serves the shape so that no timed
call and no graph capture builds anything, ahead of the calls as ``gemmrl.warmup`` does (no first-call build cap). Under capture the dispatcher serves the graph entry, eagerly
the offline one: what a user's CUDA-graph server and eager loop would get.
"""

from __future__ import annotations

from typing import Any

from ..problem import GemmProblem
from ..timing import make_timer
from . import dispatch
from .layout_choice import choose, timed_in

NAME = "gemmrl"


class GemmrlCandidate:
    def __init__(self, name: str = NAME):
        self.name, self.layout, self.acc = name, "tn", "fp32"
        self._b = self._src = None
        self._mm = None
        self._served: dict[str, str] = {}
        self._choice = None

    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        if problem.acc != "fp32":
            raise dispatch.DispatchError("gemmrl.mm accumulates in fp32; the problem asks for acc fp16")
        timing = timed_in(protocol, bufs.a.device.type)  # host-timed protocols choose the layout in device time
        with dispatch.building_ahead():  # as after gemmrl.warmup: every generated contender raced, no build cap
            self._choice = choose(problem, protocol, bufs, timer if timing == protocol else make_timer(bufs, timing))
            self.layout = self._choice.layout
            self._src = bufs.b if self.layout == "nn" else bufs.bt
            self._b = self._src if self.layout == "nn" else self._src.t()
            self._served = dispatch.served_by(bufs.a, self._b)
        self._mm = dispatch.mm

    def __call__(self, a, b, bt, c) -> None:
        src = b if self.layout == "nn" else bt
        self._mm(a, self._b if src is self._src else (src if self.layout == "nn" else src.t()), c)

    def info(self) -> dict[str, Any]:
        ch = self._choice
        how = "" if ch is None else f"; layout={ch.layout} by {ch.by}" + "".join(
            f" {lay}={t * 1e3:.2f}us" for lay, t in ch.times_ms)
        return {"algo": f"eager={self._served.get('eager', '')}; graph={self._served.get('graph', '')}; "
                        f"hot={dispatch.hot_path().split(' ')[0]}{how}"}


def gemmrl_candidates(problem: GemmProblem) -> list[GemmrlCandidate]:
    return [GemmrlCandidate()]
