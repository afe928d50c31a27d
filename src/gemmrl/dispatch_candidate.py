"""``gemmrl`` as a bench candidate: each call is ``gemmrl.mm(a, b, out=c)``, the public entry point a user calls.

``gemmrl bench --library FILE`` (or ``--library default``) adds it beside the vendor paths. Per protocol it reads
the layout whose library entry was measured fastest (graph entries for ``graph``, host-timed ones otherwise;
either layout when neither has one), and ``prepare`` builds what serves the shape (``dispatch.warmup``) so that no
timed call and no graph capture builds anything. Under capture the dispatcher serves the graph entry, eagerly
the offline one: what a user's CUDA-graph server and eager loop would get.
"""

from __future__ import annotations

from typing import Any

from .library import PROTOCOL_ORDER
from .problem import GemmProblem

NAME = "gemmrl"


class GemmrlCandidate:
    def __init__(self, name: str = NAME):
        self.name, self.layout, self.acc = name, "tn", "fp32"
        self._b = self._src = None
        self._mm = None
        self._served: dict[str, str] = {}

    def _pick_layout(self, problem: GemmProblem, protocol: str, device) -> str:
        from . import dispatch

        gpu, _ = dispatch._identity(device)
        order = PROTOCOL_ORDER["graph" if protocol == "graph" else "eager"]
        lib = dispatch.library()
        found = [(e.time_ms, lay) for lay in ("tn", "nn")
                 if (e := lib.lookup_any(gpu, problem.dtype, problem.acc, lay, order, problem.M, problem.N, problem.K))]
        return min(found)[1] if found else "tn"

    def prepare(self, problem: GemmProblem, bufs, protocol: str, timer) -> None:
        from . import dispatch

        if problem.acc != "fp32":
            raise dispatch.DispatchError("gemmrl.mm accumulates in fp32; the problem asks for acc fp16")
        a = bufs.a
        self.layout = self._pick_layout(problem, protocol, a.device)
        self._src = bufs.b if self.layout == "nn" else bufs.bt
        self._b = self._src if self.layout == "nn" else self._src.t()
        self._served = dispatch.served_by(a, self._b)
        self._mm = dispatch.mm

    def __call__(self, a, b, bt, c) -> None:
        src = b if self.layout == "nn" else bt
        self._mm(a, self._b if src is self._src else (src if self.layout == "nn" else src.t()), c)

    def info(self) -> dict[str, Any]:
        from . import dispatch

        return {"algo": f"eager={self._served.get('eager', '')}; graph={self._served.get('graph', '')}; "
                        f"hot={dispatch.hot_path().split(' ')[0]}"}


def gemmrl_candidates(problem: GemmProblem) -> list[GemmrlCandidate]:
    return [GemmrlCandidate()]
