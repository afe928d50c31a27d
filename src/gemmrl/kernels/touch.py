"""The speed-of-light probe as a candidate: ``touch_b{BLOCK}_w{warps}`` reads A and B once and writes zeros into
C in one launch (jit/touch.py). It is not a GEMM and never verifies; ``gemmrl headroom`` times it beside the
vendor paths so that, per shape and protocol, the fastest a GEMM could possibly run is measured, not assumed.

A candidate like any other (``prepare`` then ``__call__(a, b, bt, c)``), launched through the direct path
(runtime.DirectLaunch: a few us of host time, as our GEMM kernels) so that the host's launch latency never
reaches the device-time protocols' start event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..problem import GemmProblem
from .triton_gemm import runtime
from .triton_gemm.plans import A, B, C, Launch, _bind, _cdiv, resolve
from .vendor import raw_stream_getter

WARPS = (1, 2, 4, 8, 16)
VECTOR = 8  # 16-bit words per 16-byte access


class TouchError(ValueError):
    pass


@dataclass(frozen=True)
class TouchConfig:
    block: int   # 16-bit words per program
    warps: int

    @property
    def name(self) -> str:
        return f"touch_b{self.block}_w{self.warps}"


def invalid(cfg: TouchConfig) -> str | None:
    """Why ``cfg`` cannot be launched (None if it can): BLOCK a power of two that gives every thread whole
    16-byte vectors, at most 65536 words (a program's registers), warps one of 1, 2, 4, 8, 16."""
    if cfg.warps not in WARPS:
        return f"warps={cfg.warps}: use one of {WARPS}"
    b = cfg.block
    if b < 1 or b & (b - 1):
        return f"block={b}: a power of two"
    if b % (cfg.warps * 32 * VECTOR):
        return f"block={b} with {cfg.warps} warps: at least {cfg.warps * 32 * VECTOR} words (8 per thread)"
    if b > 65536:
        return f"block={b}: at most 65536 words per program"
    return None


def check(cfg: TouchConfig) -> TouchConfig:
    why = invalid(cfg)
    if why:
        raise TouchError(f"touch config {cfg.name}: {why}")
    return cfg


CONFIGS = tuple(TouchConfig(b, w) for b in (2048, 8192, 32768) for w in (4, 8))


def parse(name: str) -> TouchConfig:
    """``touch_b8192_w8`` -> TouchConfig(8192, 8) (checked)."""
    parts = name.split("_")
    try:
        if len(parts) != 3 or parts[0] != "touch" or parts[1][0] != "b" or parts[2][0] != "w":
            raise ValueError
        cfg = TouchConfig(int(parts[1][1:]), int(parts[2][1:]))
    except (ValueError, IndexError):
        raise TouchError(f"{name!r} is not a touch config name; write touch_b<BLOCK>_w<WARPS>, e.g. touch_b8192_w8") from None
    return check(cfg)


def grid_parts(problem: GemmProblem, block: int) -> tuple[int, int, int]:
    """Programs reading A, reading B, writing C."""
    p = problem
    return _cdiv(p.M * p.K, block), _cdiv(p.K * p.N, block), _cdiv(p.M * p.N, block)


class TouchCandidate:
    """Reads A and B (as the layout stores it) and zero-fills C: the floor of any GEMM, not a GEMM."""

    acc = "none"

    def __init__(self, cfg: TouchConfig, layout: str = "tn", store_all: bool = False):
        self.cfg, self.layout, self.store_all = check(cfg), layout, store_all
        self.name = cfg.name
        self.sink = None
        self._direct = None
        self._stream = None
        self._args: list = []
        self._kernel = None
        self._grid = (1, 1, 1)

    def prepare(self, problem: GemmProblem, bufs: Any, protocol: str, timer: Any) -> None:
        import torch  # start-up cost: torch loads on first use, not on import

        interpret = bufs.a.device.type == "cpu"
        k = runtime.kernels(interpret).touch.touch_kernel
        pa, pb, pc = grid_parts(problem, self.cfg.block)
        self.sink = torch.zeros(pa + pb, dtype=torch.int32, device=bufs.a.device)
        vals = dict(a_ptr=A, b_ptr=B, c_ptr=C, sink_ptr=self.sink, n_a=problem.M * problem.K,
                    n_b=problem.K * problem.N, n_c=problem.M * problem.N, P_A=pa, P_B=pb,
                    BLOCK=self.cfg.block, STORE_ALL=self.store_all)
        launch = Launch(k, (pa + pb + pc, 1, 1), _bind(k, vals), self.cfg.warps, 1)
        self._kernel, self._grid, self._args = k, launch.grid, launch.args
        self._direct = None
        compiled = self._launch_jit(self._views(bufs.a, bufs.b, bufs.bt, bufs.c))
        if not interpret:
            torch.cuda.synchronize()
            self._direct = runtime.DirectLaunch.build(compiled, launch.grid, launch.args, launch.slots(), bufs.a.device)
            index = bufs.a.device.index if bufs.a.device.index is not None else torch.cuda.current_device()
            raw = raw_stream_getter()
            self._stream = lambda: raw(index)

    def _views(self, a, b, bt, c) -> tuple:
        import torch  # start-up cost: torch loads on first use, not on import

        return tuple(t.view(torch.int16) for t in (a, bt if self.layout == "tn" else b, c))

    def _launch_jit(self, ops: tuple):
        return self._kernel[self._grid](*resolve(self._args, ops), num_warps=self.cfg.warps, num_stages=1)

    def __call__(self, a, b, bt, c) -> None:
        if self._kernel is None:
            raise TouchError("call prepare(problem, bufs, protocol, timer) before calling a touch candidate")
        if self._direct is not None:
            self._direct(self._stream(), (a.data_ptr(), (bt if self.layout == "tn" else b).data_ptr(), c.data_ptr()))
        else:
            self._launch_jit(self._views(a, b, bt, c))

    def info(self) -> dict[str, Any]:
        return {"block": self.cfg.block, "warps": self.cfg.warps, "launch": "direct" if self._direct else "jit"}
